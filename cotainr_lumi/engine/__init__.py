"""The engine: the stage interface, settings, the image probe; it imports no stage."""
