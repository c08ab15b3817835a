"""Provisioning an air-gapped host from a bundle's offline apt repository: the pure scripts, the steps
with the repository, the bundle's packages section, the staging host's download, and the run against a
scripted remote (tests/fake_remote.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from llmfleet.bundle import contents as bc
from llmfleet.errors import UsageError
from llmfleet.provision import desired as D
from llmfleet.provision import facts as F
from llmfleet.provision import offline as OFF
from llmfleet.provision import run as R
from llmfleet.provision import staging
from llmfleet.provision import steps as S
from tests.fake_remote import Command, FakeRemote
from tests.test_provision_run import NOW, TOKEN, Clock, doc, lock_cmd
from tests.test_provision_steps import SETTINGS, bare, converged, desired

SHA = "sha256:" + "ab" * 32
REPO = OFF.OfflineRepo("debian", "12", "amd64", Path("/b/packages/debian-12-amd64.tar"), SHA, 4_000_000,
                       ("docker.io=20.10.24+dfsg1-1+b3", "nvidia-driver=535.216.03-1"))
DIR = OFF.repo_dir("/opt/llmfleet", SHA)
TARGET = D.OfflineTarget(DIR, SHA, REPO.size, 2)


# -- pure --------------------------------------------------------------------------------------


def test_the_repository_lives_under_the_root_named_by_its_hash_and_apt_reads_only_it():
    assert DIR == "/opt/llmfleet/packages/abababababab"
    opts = OFF.apt_options(DIR)
    assert opts == (f"-o Dir::Etc::SourceList={DIR}/llmfleet-bundle.list -o Dir::Etc::SourceParts={DIR}/sources.list.d "
                    "-o APT::Get::List-Cleanup=0")
    assert OFF.list_line(DIR) == f"deb [trusted=yes] file:{DIR} ./\n"


@pytest.mark.parametrize(("distro", "arch", "ok"), [(("debian", "12"), "amd64", True), (("debian", "13"), "amd64", False),
                                                    (("ubuntu", "24.04"), "amd64", False), (("debian", "12"), "arm64", False)])
def test_a_host_gets_the_repository_of_its_release_and_architecture_or_one_line(distro, arch, ok):
    if ok:
        assert OFF.pick([REPO], "h1", distro, arch, "/b") is REPO
        return
    with pytest.raises(UsageError) as e:
        OFF.pick([REPO], "h1", distro, arch, "/b")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("host h1: bundle /b carries no packages for") and "(it has: debian 12 amd64)" \
        in msg and "--packages-from" in msg


def test_unpack_checks_the_hash_first_then_moves_a_complete_folder_in_place():
    script = OFF.unpack_script("/opt/llmfleet/bundle/x.tar.part", SHA, DIR)
    lines = script.splitlines()
    assert lines.index(next(ln for ln in lines if ln.startswith("got=$(sha256sum"))) < lines.index(
        next(ln for ln in lines if ln.startswith("tar -x")))
    assert f"mv -- {DIR}.new {DIR}" in script and f"> {DIR}/Packages.ok" in script
    assert OFF.parse_unpacked("@@unpacked 37\n") == 37
    assert OFF.parse_unpacked("@@corrupt\n") == -1
    assert OFF.parse_unpacked("") is None
    assert OFF.parse_present("@@repo\n") == (True, 0)
    assert OFF.parse_present("@@staged 1234\n") == (False, 1234)


def test_unpack_script_runs_for_real(tmp_path):
    """The script on this machine's shell: a damaged archive is removed, a good one unpacked and listed."""
    import hashlib
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Packages", b"Package: a\n"), ("a_1_all.deb", b"deb")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    sha = "sha256:" + hashlib.sha256(raw).hexdigest()
    staged, directory = tmp_path / "x.tar.part", tmp_path / "packages" / "abc"
    staged.write_bytes(raw[:-1] + b"x")
    bad = subprocess.run(["sh", "-c", OFF.unpack_script(str(staged), sha, str(directory))], capture_output=True,
                         text=True)
    assert OFF.parse_unpacked(bad.stdout) == -1 and not staged.exists() and not directory.exists()
    staged.write_bytes(raw)
    good = subprocess.run(["sh", "-c", OFF.unpack_script(str(staged), sha, str(directory))], capture_output=True,
                          text=True)
    assert good.returncode == 0, good.stderr
    assert OFF.parse_unpacked(good.stdout) == 1 and not staged.exists()
    assert (directory / "Packages.ok").read_text().strip() == sha
    assert (directory / "llmfleet-bundle.list").read_text() == OFF.list_line(str(directory))
    assert (directory / "sources.list.d").is_dir() and (directory / "a_1_all.deb").read_bytes() == b"deb"


def test_download_groups_merge_hosts_that_share_a_driver_pin():
    groups = OFF.download_groups([("a", ["docker.io", "nvidia-driver=535"], "pin535"),
                                  ("b", ["docker.io", "nvidia-driver=580"], "pin580"),
                                  ("c", ["docker.io", "nvidia-driver=535", "extra"], "pin535")])
    assert [(g.specs, g.pin, g.hosts) for g in groups] == [
        (("docker.io", "nvidia-driver=535", "extra"), "pin535", ("a", "c")),
        (("docker.io", "nvidia-driver=580"), "pin580", ("b",))]


def test_the_download_works_in_its_own_folder_only():
    work = OFF.WORK_PREFIX + "abc"
    script = OFF.download_script(work, [OFF.DownloadGroup(("docker.io", "nvidia-driver=535.1-1"), "PIN", ("a",))],
                                 [("keys/llmfleet-x.asc", "KEY")])
    for opt in ("Dir::State::status", "Dir::State::Lists", "Dir::Cache::archives", "Dir::Etc::SourceList",
                "Dir::Etc::SourceParts", "Dir::Etc::Preferences", "Dir::Etc::PreferencesParts"):
        assert f"-o {opt}={work}/" in script
    assert "--download-only install docker.io nvidia-driver=535.1-1" in script
    assert "cp /var/lib/dpkg/status status" in script  # a copy: the host's own status is never written
    with pytest.raises(ValueError):
        OFF.download_script("/tmp/x", [], [])
    with pytest.raises(ValueError):
        OFF.archive_command("/")


def test_parse_download_names_the_packages_or_apts_own_error():
    debs, failed = OFF.parse_download("@@deb docker.io 20.10.24+dfsg1-1+b3 docker.io_20.10.24_amd64.deb\n")
    assert debs == [("docker.io", "20.10.24+dfsg1-1+b3", "docker.io_20.10.24_amd64.deb")] and failed is None
    _, failed = OFF.parse_download("@@failed download\nReading package lists...\n"
                                   "E: Version '9.9' for 'nvidia-driver' was not found\n")
    assert failed == "apt-get download failed: E: Version '9.9' for 'nvidia-driver' was not found"


def test_inventory_sources_move_into_the_work_folder_with_their_keys():
    files = [("/etc/apt/keyrings/llmfleet-lab.asc", "KEY"),
             ("/etc/apt/sources.list.d/llmfleet-lab.sources", "Types: deb\nSigned-By: /etc/apt/keyrings/llmfleet-lab.asc\n")]
    got = OFF.staging_sources(files, "/var/tmp/llmfleet-packages-x", "/etc/apt/keyrings")
    assert got == [("keys/llmfleet-lab.asc", "KEY"),
                   ("parts/llmfleet-lab.sources", "Types: deb\nSigned-By: /var/tmp/llmfleet-packages-x/keys/llmfleet-lab.asc\n")]


def test_a_provisioned_staging_host_is_refused_in_one_line():
    OFF.refuse_provisioned("s1", {})
    with pytest.raises(UsageError) as e:
        OFF.refuse_provisioned("s1", {"docker.io": "20.10", "nvidia-driver": "535"})
    assert str(e.value).startswith("--packages-from s1: the host already has docker.io 20.10, nvidia-driver 535;")


# -- steps -------------------------------------------------------------------------------------


def test_with_a_bundle_the_repository_goes_first_and_every_apt_call_reads_only_it():
    d = desired(offline=TARGET)
    steps = S.plan_steps(d, bare())
    assert steps[0].name == "offline-repo" and steps[0].script == "" and "2 .deb, 4.0 MB" in steps[0].changes[0]
    apt_lines = [ln for s in steps for ln in s.script.splitlines() if ln.startswith("apt-get")]
    assert apt_lines and all(OFF.apt_options(DIR) in ln for ln in apt_lines)


def test_the_repository_already_on_the_host_is_not_sent_again():
    d = desired(offline=TARGET)
    f = bare()
    f.files[TARGET.marker] = F.FileState(True, "644", "root", "root", (SHA + "\n").encode())
    assert "offline-repo" not in [s.name for s in S.plan_steps(d, f)]
    f.files[TARGET.marker] = F.FileState(True, "644", "root", "root", b"sha256:other\n")  # another bundle's
    assert S.plan_steps(d, f)[0].name == "offline-repo"


def test_a_host_that_needs_no_package_needs_no_repository():
    d = desired(offline=TARGET)
    assert S.plan_steps(d, converged(d)) == []
    f = converged(d)
    f.groups = {"deploy"}  # only the user step: no apt
    assert [s.name for s in S.plan_steps(d, f)] == ["user"]


def test_a_repair_reads_the_repository_too():
    assert S.repair(OFF.apt_options(DIR)).splitlines()[-1].startswith(f"apt-get {OFF.apt_options(DIR)} -y")
    assert S.repair() == S.REPAIR


# -- bundle.json ---------------------------------------------------------------------------------


def _bundle_doc(**extra) -> dict:
    return {"format": bc.FORMAT, "created": "2026-12-06T00:00:00Z", "lock": {"path": "images.lock", "sha256": SHA},
            "files": [{"path": "images.lock", "size": 1, "sha256": SHA},
                      {"path": "packages/debian-12-amd64.tar", "size": 9, "sha256": SHA}], **extra}


def test_the_bundle_lists_its_packages_and_reads_them_back():
    pk = {"distro": "debian", "version": "12", "arch": "amd64", "archive": "packages/debian-12-amd64.tar",
          "source": "gpu-bare-08", "packages": ["docker.io=1"]}
    b = bc.parse_bundle(json.dumps(_bundle_doc(packages=[pk])))
    assert b.packages == (bc.BundlePackages("debian", "12", "amd64", "packages/debian-12-amd64.tar", "gpu-bare-08",
                                            ("docker.io=1",)),)
    assert json.loads(b.render())["packages"] == [pk]
    assert bc.structure_problems(b) == []
    assert "packages" not in json.loads(bc.parse_bundle(json.dumps(_bundle_doc())).render())


@pytest.mark.parametrize(("field", "value", "msg"), [("archive", "../x.tar", "must be relative inside the bundle"),
                                                      ("distro", None, "packages[0].distro is missing")])
def test_a_malformed_packages_entry_is_named(field, value, msg):
    pk = {"distro": "debian", "version": "12", "arch": "amd64", "archive": "packages/debian-12-amd64.tar"}
    pk[field] = value
    with pytest.raises(UsageError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        bc.parse_bundle(json.dumps(_bundle_doc(packages=[pk])))


def test_an_unlisted_archive_is_a_problem():
    pk = {"distro": "debian", "version": "12", "arch": "amd64", "archive": "packages/debian-13-amd64.tar"}
    b = bc.parse_bundle(json.dumps(_bundle_doc(packages=[pk])))
    assert [p.path for p in bc.structure_problems(b)] == ["packages/debian-13-amd64.tar"]


def test_a_bundle_without_packages_is_refused_for_provisioning(tmp_path):
    from llmfleet.bundle import check

    (tmp_path / "bundle.json").write_text(json.dumps(_bundle_doc()))
    with pytest.raises(UsageError, match="carries no packages; build it with `bundle.create --packages-from HOST`"):
        check.verified_packages(tmp_path)


# -- the staging host ----------------------------------------------------------------------------


def test_the_staging_host_downloads_what_each_target_would_install_with_its_own_card():
    f = bare()
    f.gpus, f.smi, f.driver_running = ["NVIDIA H200"], "ok", "580.65.06"  # the staging host's own card is not used
    v100 = SETTINGS
    t4 = SETTINGS.model_copy(update={"gpu": "Tesla T4"})
    got = staging.wanted([("a", v100, ()), ("b", t4, ())], f, "deploy")
    want_a = D.desired_state("a", v100, dataclasses.replace(f, gpus=[], smi="absent", driver_running=None), user="deploy")
    assert got[0] == ("a", [p.spec for p in want_a.packages],
                      next(x.content for x in want_a.files if x.path == D.DRIVER_PIN_FILE))
    assert [h for h, _, _ in got] == ["a", "b"]


# -- the run ---------------------------------------------------------------------------------------


def _facts_cmd() -> str:
    return F.facts_script("M", D.facts_query(SETTINGS, "deploy", [f"{DIR}/Packages.ok"]))


def _make(remote, sent: list, *, check: bool = False, repos=(REPO,)):
    clock = Clock()

    def connect():
        remote.user = "deploy"
        return remote

    def send(link, local, dest, *, offset, size, sudo):
        sent.append((local, dest, offset, size))

    return R.Provisioner("gpu-bare-01", SETTINGS, connect, log=lambda _l: None, who="ops@ctl", origin="ops@ctl", pid=42,
                         check=check, now=lambda: NOW, clock=clock, sleep=clock.sleep, token=lambda: TOKEN,
                         mark=lambda: "M", offline=repos, bundle="/b", send=send)


def test_check_with_a_bundle_shows_the_repository_step_and_sends_nothing():
    remote = FakeRemote([Command(_facts_cmd(), doc(bare()))])
    sent: list = []
    o = _make(remote, sent, check=True).provision()
    assert o.result == "would change" and o.steps[0].name == "offline-repo" and sent == []
    remote.assert_done()


def test_the_run_sends_resumes_and_unpacks_the_repository_before_apt_runs():
    d = desired(offline=TARGET)
    plan = S.plan_steps(d, bare())
    staged = OFF.staged_archive("/opt/llmfleet", SHA)
    remote = FakeRemote([Command(_facts_cmd(), doc(bare())), Command(lock_cmd(), "@@acquired\n"),
                         Command(OFF.present_script(DIR, staged), "@@staged 1000\n"),
                         Command("mkdir -p -- /opt/llmfleet/bundle"),
                         Command(OFF.unpack_script(staged, SHA, DIR), "@@unpacked 2\n"),
                         Command(plan[1].script, exit=100, err="E: boom"), Command(S.repair(OFF.apt_options(DIR))),
                         Command(None, "@@released\n")])
    sent: list = []
    o = _make(remote, sent).provision()
    assert sent == [("/b/packages/debian-12-amd64.tar", staged, 1000, REPO.size)]  # resumed at what the host holds
    assert [(s.name, s.status) for s in o.steps[:3]] == [("offline-repo", "changed"), ("sources", "failed"),
                                                       ("packages-runtime", "not run")]
    assert '"step":"offline-repo"' in remote.sent[-1]
    remote.assert_done()


def test_an_archive_damaged_on_the_way_is_sent_again():
    staged = OFF.staged_archive("/opt/llmfleet", SHA)
    remote = FakeRemote([Command(_facts_cmd(), doc(bare())), Command(lock_cmd(), "@@acquired\n"),
                         Command(OFF.present_script(DIR, staged)), Command("mkdir -p -- /opt/llmfleet/bundle"),
                         Command(OFF.unpack_script(staged, SHA, DIR), "@@corrupt\n", exit=3),
                         Command(OFF.present_script(DIR, staged)), Command("mkdir -p -- /opt/llmfleet/bundle"),
                         Command(OFF.unpack_script(staged, SHA, DIR), "@@unpacked 2\n"),
                         Command(None, exit=1, err="stop here"), Command(None), Command(None, "@@released\n")])
    sent: list = []
    o = _make(remote, sent).provision()
    assert [x[2] for x in sent] == [0, 0] and o.steps[0].status == "changed"
    remote.assert_done()


def test_a_host_of_another_release_is_refused_before_the_lock():
    f = bare()
    f.os = {"ID": "ubuntu", "VERSION_ID": "24.04"}
    remote = FakeRemote([Command(_facts_cmd(), doc(f))])
    o = _make(remote, []).provision()
    assert o.result == "refused" and o.usage and "carries no packages for ubuntu 24.04 amd64" in o.message
    remote.assert_done()
