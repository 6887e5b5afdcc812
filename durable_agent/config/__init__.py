"""Settings and where they come from: defaults, files, environment, flags; tool sources."""
