import sys

from tealite_verify.cli import main

sys.exit(main())
