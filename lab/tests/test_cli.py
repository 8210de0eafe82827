from click.testing import CliRunner

from zbdlab.cli import main


def test_help_lists_every_subcommand() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in ("run", "compare", "report", "corpus"):
        assert name in result.output
