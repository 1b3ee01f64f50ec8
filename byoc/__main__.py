import sys

from byoc.cli import main

sys.exit(main())
