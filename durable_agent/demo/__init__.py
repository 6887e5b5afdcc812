"""The bundled offline demo: a tiny buggy project and a scripted model that fixes it."""
