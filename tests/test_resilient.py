"""`--resilient[=N]`: the tag parser, the SPANK plugin build, `medic sbatch`, and the plugin
with cli_filter.lua on the lab's real Slurm (the lab loads both, as a site would)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.lab.cluster import Lab
from cli.sbatch import sbatch, sbatch_argv
from medic_core import proc
from medic_core.resilient import DEFAULT_RESTARTS, parse_resilient, tag
from slurm_hooks.checkpoint import CheckpointDir
from slurm_hooks.spank import build
from tests.conftest import poll

# ---- the tag ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        (None, None),
        ("", None),
        ("medic:resilient=2", 2),
        ("nightly run medic:resilient=0", 0),
        ("medic:resilient=5 owner=ana", 5),
        ("medic:resilient=", None),
        ("medic:resilient=x", None),
        ("medic:resilient=-1", None),
        ("medic:resilient=100000", None),
        ("xmedic:resilient=2", None),
        ("medic:resilient=2x", None),
        ("medic:resilients=2", None),
    ],
)
def test_parse_resilient(comment: str | None, expected: int | None) -> None:
    assert parse_resilient(comment) == expected


def test_tag_keeps_the_comment_and_replaces_an_old_tag() -> None:
    assert tag(None, 2) == "medic:resilient=2"
    assert tag("keep me", 3) == "keep me medic:resilient=3"
    assert tag("a medic:resilient=9 b", 1) == "a b medic:resilient=1"
    assert parse_resilient(tag("x", DEFAULT_RESTARTS)) == DEFAULT_RESTARTS
    with pytest.raises(ValueError, match="from 0 to"):
        tag("", -1)


# ---- the plugin build ------------------------------------------------------------------


def test_plugin_builds_and_exports_the_spank_entry_points(tmp_path: Path) -> None:
    plugin = build.build_plugin(tmp_path)
    assert plugin == tmp_path / build.PLUGIN_NAME
    symbols = proc.run(["nm", "-D", "--defined-only", str(plugin)], timeout=10, check=True)
    exported = {line.split()[-1] for line in symbols.stdout.splitlines()}
    assert {"slurm_spank_init", "slurm_spank_init_post_opt", "plugin_name"} <= exported
    # The plugin's default is Python's, passed at compile time.
    assert f"(default {DEFAULT_RESTARTS})".encode() in plugin.read_bytes()
    built = plugin.stat().st_mtime_ns
    assert build.build_plugin(tmp_path).stat().st_mtime_ns == built  # up to date: no rebuild


def test_plugin_build_without_spank_h_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match=r"spank\.h not found: .*apt-get install libslurm"):
        build.build_plugin(tmp_path / "out", include_dir=tmp_path)


# ---- medic sbatch ----------------------------------------------------------------------


def test_sbatch_argv_adds_requeue_and_tag() -> None:
    assert sbatch_argv(None, ["-N1", "job.sh"]) == ["sbatch", "-N1", "job.sh"]
    assert sbatch_argv(2, ["-N1", "job.sh", "--comment", "x"]) == [
        "sbatch",
        "--requeue",
        "-N1",
        "job.sh",
        "--comment",
        "x medic:resilient=2",
    ]
    assert sbatch_argv(3, ["--comment=keep me", "job.sh"]) == [
        "sbatch",
        "--requeue",
        "--comment=keep me medic:resilient=3",
        "job.sh",
    ]
    assert sbatch_argv(0, ["job.sh"]) == [
        "sbatch",
        "--requeue",
        "--comment=medic:resilient=0",
        "job.sh",
    ]


def test_medic_sbatch_rejects_bad_arguments() -> None:
    runner = CliRunner()
    result = runner.invoke(sbatch, ["--resilient=many", "job.sh"])
    assert result.exit_code == 2 and "--resilient=many: expected a number" in result.output
    result = runner.invoke(sbatch, ["--resilient", "--no-requeue", "job.sh"])
    assert result.exit_code == 2 and "drop --no-requeue" in result.output
    result = runner.invoke(sbatch, ["--resilient", "--wait", "job.sh"])
    assert result.exit_code == 2 and "--wait is not supported" in result.output


# ---- on the lab's Slurm ----------------------------------------------------------------


def _job(lab: Lab, job_id: str) -> dict[str, Any]:
    # squeue --json ignores --jobs in 22.05: filter here.
    jobs = json.loads(lab.slurm(["squeue", "--json"]).stdout)["jobs"]
    job: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
    return job


def _finished(lab: Lab, job_id: str) -> bool:
    return bool(_job(lab, job_id)["job_state"] == "COMPLETED")


def _submit(lab: Lab, args: list[str], env: dict[str, str] | None = None) -> str:
    full_env = lab.process_env()
    full_env.update(env or {})
    result = proc.run(["sbatch", "--parsable", *args], timeout=15, env=full_env, check=True)
    return result.stdout.strip()


def test_resilient_option_makes_the_job_requeueable_and_tags_it(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job_id = _submit(
        lab,
        [
            "--resilient=2",
            "--no-requeue",  # --resilient wins: the job must be requeueable
            "--comment=keep me",
            f"--output={out}",
            "--wrap",
            "echo SPANK=$SLURM_SPANK_RESILIENT REQUEST=${MEDIC_RESILIENT_REQUEST:-unset}",
        ],
    )
    job = _job(lab, job_id)
    assert job["requeue"] is True
    assert job["comment"] == "keep me medic:resilient=2"
    assert parse_resilient(job["comment"]) == 2
    poll("the job to complete", lambda: _finished(lab, job_id))
    # The job sees N; the client-side request variable does not leak into it.
    assert out.read_text().strip() == "SPANK=2 REQUEST=unset"


def test_bare_resilient_in_a_batch_script_uses_the_default(lab: Lab, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --resilient\n#SBATCH --no-requeue\necho $SLURM_SPANK_RESILIENT\n"
    )
    out = tmp_path / "job.out"
    job_id = _submit(lab, [f"--output={out}", str(script)])
    job = _job(lab, job_id)
    assert (job["requeue"], job["comment"]) == (True, f"medic:resilient={DEFAULT_RESTARTS}")
    poll("the job to complete", lambda: _finished(lab, job_id))
    assert out.read_text().strip() == str(DEFAULT_RESTARTS)


def test_other_jobs_are_left_alone(lab: Lab) -> None:
    # Even with the request variable in the environment (a job inherited it, say): only the
    # option given to this very sbatch counts.
    job_id = _submit(
        lab,
        ["--no-requeue", "--comment=plain", "--wrap", "true"],
        env={"MEDIC_RESILIENT_REQUEST": "7"},
    )
    job = _job(lab, job_id)
    assert (job["requeue"], job["comment"]) == (False, "plain")


def test_bad_resilient_value_is_refused_by_sbatch(lab: Lab) -> None:
    result = lab.slurm(["sbatch", "--resilient=lots", "--wrap", "true"], check=False)
    assert result.returncode != 0
    assert "--resilient=lots: expected a number of restarts" in result.stderr


def test_medic_sbatch_submits_a_resilient_job(lab: Lab) -> None:
    env = lab.process_env()
    result = CliRunner().invoke(
        sbatch,
        ["--resilient=4", "--parsable", "--comment", "mine", "--wrap", "true"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    job = _job(lab, result.output.strip())
    assert (job["requeue"], job["comment"]) == (True, "mine medic:resilient=4")


def test_requeued_resilient_job_resumes_from_its_last_checkpoint(lab: Lab, tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    out = tmp_path / "job.out"
    script = tmp_path / "train.py"
    # First run: checkpoint step 0, then wait to be requeued. Second run: resume after it.
    script.write_text(
        "import os, time\n"
        "from slurm_hooks.checkpoint import CheckpointDir, restart_count\n"
        "ckpt = CheckpointDir()\n"
        "last = ckpt.resume_step()\n"
        "print(f'run={restart_count()} resume={last}', flush=True)\n"
        "step = 0 if last is None else last + 1\n"
        "with ckpt.writing(step) as tmp:\n"
        "    (tmp / 'w').write_text(str(step))\n"
        "if restart_count() == 0:\n"
        "    time.sleep(300)\n"
    )
    env = {"MEDIC_CHECKPOINT_DIR": str(ckpt_dir), "PYTHONPATH": str(Path(__file__).parents[1])}
    job_id = _submit(
        lab,
        [
            "--resilient=1",
            f"--output={out}",
            "--open-mode=append",
            "--wrap",
            f"{sys.executable} {script}",
        ],
        env=env,
    )
    checkpoints = CheckpointDir(ckpt_dir)
    poll("the first checkpoint", lambda: checkpoints.resume_step() == 0, timeout=15)
    first_node = _job(lab, job_id)["batch_host"]
    lab.slurm(["scontrol", "requeue", job_id])
    poll(
        "the job to be pending again",
        lambda: _job(lab, job_id)["job_state"] == "PENDING",
        timeout=15,
    )
    # As after a node failure: run it elsewhere, at once. (On the same node slurmd refuses
    # the job until its revoked credential expires, cred_expire+1 s.)
    lab.slurm(
        ["scontrol", "update", f"jobid={job_id}", f"excnodelist={first_node}", "starttime=now"]
    )
    poll("the requeued job to complete", lambda: _finished(lab, job_id), timeout=30)
    assert _job(lab, job_id)["batch_host"] != first_node
    assert checkpoints.resume_step() == 1
    runs = [line for line in out.read_text().splitlines() if line.startswith("run=")]
    assert runs == ["run=0 resume=None", "run=1 resume=0"]
    assert _job(lab, job_id)["restart_cnt"] == 1
