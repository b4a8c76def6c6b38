"""The version of meshconf, read by the package, the CLI and the wheel's metadata."""

__version__ = "0.1.0"
