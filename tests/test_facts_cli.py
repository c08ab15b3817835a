"""The tables of `invoke facts` / `invoke preflight` show host output as text, never as rich markup."""

from __future__ import annotations

from llmfleet.cli.facts_tasks import _print_facts, _print_report
from llmfleet.knowledge.facts import Facts, GpuFact
from llmfleet.knowledge.preflight import Check, Report


def test_hostile_host_output_is_printed_literally(capsys):
    f = Facts(host="h[/]", gpus=[GpuFact(index=0, name="[bold]Tesla[/bold] [/]")],
              errors=["nvidia-smi: unexpected query line '[/red]'"])
    _print_facts(f)
    _print_report(Report("h[/]", "s", [Check("gpu", "fail", "saw [/] and [link=x]y[/link]", "fix [b]it[/b]")]))
    out = capsys.readouterr().out
    assert "[bold]Tesla[/bold] [/]" in out
    assert "'[/red]'" in out
    assert "saw [/] and [link=x]y[/link]" in out and "fix [b]it[/b]" in out
    assert "FAIL" in out
