"""Registers every mutant of ``prob_mutants`` as backend ``mut_<name>`` (a plug-in for ``run`` and
``fuzz``): TEALITE_BACKEND_MODULES=prob_mutants_plugin PYTHONPATH=tests/external."""
from prob_mutants import MUTANTS, register
from tealite.registry import Backend, register_backend

for _name in MUTANTS:
    register(register_backend(Backend(name=f"mut_{_name}", description="seeded bug "
                                      "(tests/external/prob_mutants.py)"), replace=True), _name)
