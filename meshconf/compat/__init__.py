"""Drop-ins for the mesh APIs of other training frameworks, backed by meshconf."""
