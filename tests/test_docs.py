"""The manual's generated pages are current."""

from pathlib import Path

from lucidrl.config.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_the_configuration_reference_page_is_generated_from_the_schema():
    page = ROOT / "docs" / "reference" / "configuration.md"
    assert page.read_text() == reference_markdown(), (
        "docs/reference/configuration.md is stale: run `python -m lucidrl.config.reference "
        "docs/reference/configuration.md` (make docs does)"
    )


def test_every_schema_key_appears_in_the_reference_with_its_default():
    text = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    from lucidrl.config.fields import all_keys
    from lucidrl.config.schema import LucidConfig

    leaves = [
        k for k in all_keys(LucidConfig) if not any(o.startswith(k + ".") for o in all_keys(LucidConfig))
    ]
    missing = [k for k in leaves if f"| `{k}` |" not in text]
    assert not missing, missing


def test_every_config_key_says_what_it_means():
    """The reference's meaning column comes from the comment beside each field in schema.py."""
    from lucidrl.config.reference import undocumented
    from lucidrl.config.schema import LucidConfig, SFTConfig

    missing = undocumented(LucidConfig) + undocumented(SFTConfig)
    assert not missing, f"keys without a comment in lucidrl/config/schema.py: {missing}"
