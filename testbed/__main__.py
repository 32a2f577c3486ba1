import sys

from testbed.cluster import main

raise SystemExit(main(sys.argv))
