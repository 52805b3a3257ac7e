"""The project's own Triton kernels for paged attention (imported only when the triton backend is chosen)."""
