"""Op front-ends: argument validation, documented semantics, dispatch to a backend."""
