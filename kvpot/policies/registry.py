"""The table of policies by name that `make_policy` builds from (kvpot/policies/__init__.py fills it and holds
`register_policy`): a module below every policy, so a policy that names the others (IMDC, whose pruner must be
one of them) reads it without importing the package that imports that policy."""

POLICIES: dict[str, type] = {}
