"""Careless commands: flags (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts).

Other tools' habits (Ansible's flags, kamal's and systemctl's bare host/service/release words, `help`,
`version`, `--dry-run`, `--tail`) get llmfleet's way in one line, naming only flags the task has; none
connects anywhere.
"""

from tests.careless import Cmd

H = "gpu-v100-01"

ROWS: list[Cmd] = [
    # -e after a task is Ansible's --extra-vars, not Invoke's --echo
    Cmd(("deploy", "--host", H, "-e", "foo=bar"), 2, says="no extra vars: set a variable in the inventory"),
    Cmd(("upgrade", "--group", "v100", "-e", "context=8192"), 2, says="llmfleet upgrade --set context=8192"),
    Cmd(("-e", "foo=bar", "deploy", "--host", H), 2, says="host_vars/HOST.yml"),
    Cmd(("deploy", "--host", H, "-e"), 2, says="--echo"),
    # -T on a task without --timeout names no --timeout flag of that task
    Cmd(("deploy", "--host", H, "-T", "5"), 2, says="deploy has no --timeout; set llmfleet.ssh.connect_timeout"),
    Cmd(("render", "--host", H, "--timeout", "5"), 2, says="render has no --timeout"),
    Cmd(("deploy", "--host", H, "--command-timeout", "5"), 2, says="set llmfleet.ssh.command_timeout in invoke.yaml"),
    Cmd(("-T", "5", "status", "--host", H), 2, says="`llmfleet status -T 5`"),
    # inventory -l is its --limit (ansible-inventory -l), not Invoke's --list
    Cmd(("inventory", "-l", H), 0, says=H),
    Cmd(("inventory", "--list", "-l", H), 2, says="--list and --host print the whole inventory"),
    # bare host / service / release words
    Cmd(("deploy", H), 2, says=f"did you mean `llmfleet deploy --host {H}`?"),
    Cmd(("rollback", H, "chat"), 2, says=f"`llmfleet rollback --host {H} --service chat`"),
    Cmd(("status", H), 2, says=f"`llmfleet status --host {H}`"),
    Cmd(("rollback", "--host", H, "20261201-1200"), 2, says=f"`llmfleet rollback --host {H} --to 20261201-1200`"),
    Cmd(("help",), 2, says="`llmfleet --help`"),
    Cmd(("help", "deploy"), 2, says="`llmfleet --help deploy`"),
    Cmd(("deploy", "help"), 2, says="`llmfleet --help deploy`"),
    Cmd(("version",), 2, says="`llmfleet --version`"),
    Cmd(("--dry-run",), 2, says="--check"),
    Cmd(("deploy", "--host", H, "--dry-run"), 2, says="did you mean `llmfleet deploy --check`?"),
    Cmd(("stop", "--host", H, "--dry-run"), 2, says="stop has no --check"),
    Cmd(("logs", "--host", H, "--tail", "20"), 2, says="`llmfleet logs -n 20`"),
    Cmd(("logs", "--host", H, "--tail=20"), 2, says="`llmfleet logs -n 20`"),
    # Ansible's flags
    Cmd(("--limit", H, "deploy"), 2, says=f"`llmfleet deploy --limit {H}`"),
    Cmd(("--limit", H), 2, says=f"`llmfleet deploy --host {H}`"),
    Cmd(("render", "--host", H, "--diff"), 2, says="render has no --diff"),
    Cmd(("deploy", "--host", H, "-K"), 2, says="never asks for a sudo password"),
    Cmd(("deploy", "--host", H, "--become"), 2, says="ansible_become"),
    Cmd(("deploy", "--host", H, "-u", "root"), 2, says="set ansible_user"),
    Cmd(("deploy", "--host", H, "--private-key", "~/.ssh/id_ed25519"), 2, says="ansible_ssh_private_key_file"),
    Cmd(("deploy", "--host", H, "--tags", "chat"), 2, says="`llmfleet deploy --service chat`"),
    Cmd(("status", "--host", H, "--tags", "chat"), 2, says="llmfleet has no tags"),
    Cmd(("render", "--host", H, "--forks", "4"), 2, says="render has no --forks"),
    Cmd(("render", "--host", H, "-f", "4"), 2, says="render has no --forks"),
    Cmd(("deploy", "--host", H, "-c", "local"), 2, says="connects over SSH"),
    Cmd(("remove", "--host", H, "-y"), 2, says="`llmfleet remove --yes`"),
    # --context takes k and M (binary, as 256k = 262144); garbage is one line
    Cmd(("plan", "--gpu", "v100-sxm2-32gb", "--model", "qwen2.5-7b", "--context", "1M", "--json"), 1, json=True,
        one_line=False),
    Cmd(("plan", "--gpu", "v100-sxm2-32gb", "--model", "qwen2.5-7b", "--context", "1MB"), 2,
        says="--context: '1MB' is not a whole number"),
]
