import os

# Must precede any hypothesis use: pick the deterministic CI profile unless told otherwise.
from tealite_verify import profiles

profiles.load(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
