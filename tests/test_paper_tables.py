"""Every system of the papers' comparison tables runs in kattn: each row of
:data:`kattn.papers.TABLES` names a registered mechanism whose options build, or says why it is
not an attention mechanism."""

import pytest

import kattn
from kattn.papers import TABLES, reported_listops, table_mechanisms

ROWS = [(t, r) for t in TABLES for r in t.rows]


@pytest.mark.parametrize(
    ("table", "row"), ROWS, ids=[f"{t.paper}-{t.table}-{r.label}" for t, r in ROWS]
)
def test_every_row_runs_with_a_registered_mechanism(table, row):
    if row.mechanism is None:
        assert row.why, f"{table.paper} {table.table}: {row.label!r} names no mechanism or reason"
        return
    assert row.mechanism in kattn.available(), (
        f"{table.paper} {table.table}: {row.label!r} needs mechanism {row.mechanism!r}, "
        "which is not registered"
    )
    attn = kattn.build(row.mechanism, head_dim=8, num_heads=2, max_len=64, **row.options)
    assert isinstance(attn, kattn.Attention)


def test_the_tables_cover_the_baselines_of_every_paper():
    # the systems the issue names: the structured-sparse and content-based baselines
    wanted = {
        *("local", "longformer", "bigbird", "sparse_transformer", "reformer", "smyrf"),
        *("clustered", "improved_clustered", "sinkhorn", "synthesizer", "informer", "rfa_gate"),
        *("linformer", "nystromformer", "performer", "linear", "softmax"),
    }
    assert wanted <= set(table_mechanisms())


def test_reported_listops_numbers_are_the_papers():
    # Chen et al. 2021, Table 1 and the KL-Transformer paper, Table 2, as printed
    assert ("Chen et al. 2021 (Skyformer), Table 1", 37.68) in reported_listops("reformer")
    assert dict(reported_listops("informer")) == {"Chen et al. 2021 (Skyformer), Table 1": 32.53}
    assert len(reported_listops("bigbird")) == 3  # Skyformer, KL-Transformer, thesis


def test_the_choosing_page_and_the_readme_name_every_system_of_the_tables():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    choosing = (root / "docs" / "choosing-a-mechanism.md").read_text()
    readme = (root / "README.md").read_text()
    for name in table_mechanisms():
        assert f"`{name}`" in choosing or name.startswith("ffk_"), name
        assert f"| {name} |" in readme, f"README.md's mechanism table has no row {name}"
