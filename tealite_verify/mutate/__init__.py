"""Mutation score: how many deliberate bugs the harness catches (``python -m tealite_verify
mutate``; docs/mutation.md).

* ``base``           the :class:`Mutation` type, the library registry, perturbation helpers;
* ``operators_*``    the library, one module per op family;
* ``plugin``         the ``mutant`` backend (torch + one mutation), for the suite and the fuzzer;
* ``score``          killed by the suite's cases / by fuzz / survived, and why;
* ``fuzz``           one fuzz campaign on a mutant, in a subprocess;
* ``thresholds``     each op's detection threshold in output ulps;
* ``report``, ``cli`` tables, JSON, Markdown, the subcommand.
"""
from tealite_verify.mutate.base import Mutation, get_mutation, library

__all__ = ["Mutation", "get_mutation", "library"]
