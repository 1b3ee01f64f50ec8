"""The metadata-module runtime: build a partitioned module (`build`), run it, export and load one
artifact (`model`). Its loading and running import nothing of the compiler (see
byoc.backend.runtime), so they work where only TVM's runtime is installed."""
