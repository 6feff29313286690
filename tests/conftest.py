import os

from hypothesis import settings

# Deterministic property tests: derandomized, no wall-clock deadline (CI machines are slow and shared).
settings.register_profile("sssd", derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "sssd"))
