"""Integrations with other tools; each is imported only by its users."""
