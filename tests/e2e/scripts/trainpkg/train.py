"""Run as ``-m trainpkg.train``: prints how it was run (its name, argv, and its package's helper), as JSON."""

import json
import os
import sys

from trainpkg import __doc__ as package_doc

print(json.dumps({"name": __name__, "argv0": sys.argv[0], "args": sys.argv[1:], "rank": os.environ.get("RANK"),
                  "package": bool(package_doc)}), flush=True)
