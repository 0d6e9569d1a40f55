"""A subcommand module whose own import fails (tests/test_cli_imports.py): hal must not hide that."""
import no_such_dependency_for_test  # noqa: F401
