import subprocess

import pytest

from cotainr_lumi.stages.lumi_env.entrypoint import entrypoint_block

#: LAIF's entry point (containerfiles/mpich/Ubuntu_Rocm_Slingshot, index 018f2e6d).
LAIF = """#!/bin/bash
if [ "${SLURM_NNODES}" = 1 ] && [ -z "${SLURM_GPUS_ON_NODE}" ]; then
    export FI_HMEM_DISABLE_P2P=1
fi
exec "$@"
"""
RUNSCRIPT = """#!/bin/sh
OCI_ENTRYPOINT='"/opt/oci-entrypoint.sh"'
OCI_CMD=''
"""


def make_root(tmp_path, script=LAIF, runscript=RUNSCRIPT):
    root = tmp_path / "root"
    (root / ".singularity.d").mkdir(parents=True)
    (root / "opt").mkdir()
    (root / ".singularity.d/runscript").write_text(runscript)
    (root / "opt/oci-entrypoint.sh").write_text(script)
    return root


def run_block(block, *, local="", exported=""):
    """Source the block as Apptainer does (host variables in $__exported_env__)."""
    script = f"{local}\n{block}\n" + 'echo "P2P=${FI_HMEM_DISABLE_P2P-unset}"'
    script += ' "NNODES=${SLURM_NNODES-unset}"'
    env = {"PATH": "/usr/bin:/bin", "__exported_env__": exported}
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()


@pytest.mark.parametrize(
    ("exported", "local", "expected"),
    [
        ("SLURM_NNODES=1", "", ["P2P=1", "NNODES=unset"]),  # host's, read then unset
        ("SLURM_NNODES=1\nSLURM_GPUS_ON_NODE=8", "", ["P2P=unset", "NNODES=unset"]),
        ("SLURM_NNODES=2", "", ["P2P=unset", "NNODES=unset"]),
        ("", "SLURM_NNODES=1", ["P2P=1", "NNODES=1"]),  # the container's own stays
        ("", "", ["P2P=unset", "NNODES=unset"]),
    ],
)
def test_the_entrypoints_environment_is_reproduced(tmp_path, exported, local, expected):
    block, label = entrypoint_block(root=make_root(tmp_path))
    assert label == "reproduced: /opt/oci-entrypoint.sh (FI_HMEM_DISABLE_P2P)"
    assert run_block(block, local=local, exported=exported) == expected


@pytest.mark.parametrize(
    "script",
    [
        LAIF.replace("export FI_HMEM", "rm -rf /tmp/x; export FI_HMEM"),
        LAIF.replace("=1\n", "=$(hostname)\n"),
        LAIF.replace('exec "$@"', 'exec python "$@"'),
        LAIF.replace("fi\n", ""),  # `sh -n` refuses it
        "#!/usr/bin/env python3\nimport os\n",
    ],
)
def test_anything_else_is_a_warning_naming_the_script(tmp_path, caplog, script):
    block, label = entrypoint_block(root=make_root(tmp_path, script=script))
    assert (block, label) == ("", "not reproduced: /opt/oci-entrypoint.sh")
    assert "OCI entry point /opt/oci-entrypoint.sh is not plain sh" in caplog.text


def test_no_entrypoint_no_block(tmp_path):
    assert entrypoint_block(root=make_root(tmp_path, runscript="#!/bin/sh\n")) == (
        "",
        "",
    )
    root = make_root(tmp_path / "b", runscript=RUNSCRIPT.replace("/opt/", "/none/"))
    assert entrypoint_block(root=root) == (
        "",
        "not reproduced: /none/oci-entrypoint.sh",
    )
