"""Engine images: images.lock (pins, mirrors, builds), the registry client and the Dockerfile linter."""
