"""The plan of a build over the fixed stage pipeline, and running it."""
