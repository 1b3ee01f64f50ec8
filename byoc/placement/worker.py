"""The measuring worker's entry point: `python -m byoc.placement.worker FD`, FD one end of a
socket pair (see `byoc.placement.measure.LocalMeasurer`). Kept apart from `measure` because
`byoc` imports that module, and running an imported module as `__main__` runs it twice."""

import sys
from multiprocessing.connection import Connection

from byoc.placement.measure import serve

if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
