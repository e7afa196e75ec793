# shellcheck shell=sh
# Minimal stand-in for conda's etc/profile.d/conda.sh (cotainr-lumi e2e base
# image). Conda channels are unreachable in the test environment, so the image
# ships a Python venv at /opt/cotainr/conda/envs/conda_container_env and this
# file provides the `conda activate NAME` / `conda deactivate` shell function
# that cotainr's /.singularity.d/env/92-cotainr-env.sh calls.
# Keep it POSIX sh: Apptainer evaluates env scripts with its own interpreter.

export CONDA_EXE=/opt/cotainr/conda/bin/conda
export _CE_M=
export _CE_CONDA=
_CONDA_ROOT=/opt/cotainr/conda

__conda_strip_path() {
    # Remove every occurrence of directory $1 from PATH.
    __conda_new=
    __conda_oldifs=$IFS
    IFS=:
    set -f
    for __conda_p in $PATH; do
        if [ "$__conda_p" != "$1" ]; then
            __conda_new="${__conda_new:+$__conda_new:}$__conda_p"
        fi
    done
    set +f
    IFS=$__conda_oldifs
    PATH=$__conda_new
    unset __conda_new __conda_oldifs __conda_p
}

__conda_deactivate() {
    if [ -n "${CONDA_PREFIX:-}" ]; then
        __conda_strip_path "$CONDA_PREFIX/bin"
        export PATH
    fi
    unset CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER
    export CONDA_SHLVL=0
}

__conda_activate() {
    __conda_name=${1:-base}
    case "$__conda_name" in
        base) __conda_prefix=$_CONDA_ROOT ;;
        */*) __conda_prefix=$__conda_name ;;
        *) __conda_prefix=$_CONDA_ROOT/envs/$__conda_name ;;
    esac
    if [ ! -d "$__conda_prefix" ]; then
        echo "EnvironmentNameNotFound: Could not find conda environment: $__conda_name" >&2
        unset __conda_name __conda_prefix
        return 1
    fi
    if [ -n "${CONDA_PREFIX:-}" ]; then
        __conda_strip_path "$CONDA_PREFIX/bin"
    fi
    export PATH="$__conda_prefix/bin:$PATH"
    export CONDA_PREFIX="$__conda_prefix"
    export CONDA_DEFAULT_ENV="$__conda_name"
    export CONDA_PROMPT_MODIFIER="($__conda_name) "
    export CONDA_SHLVL=1
    unset __conda_name __conda_prefix
}

conda() {
    if [ "$#" -lt 1 ]; then
        "$CONDA_EXE"
        return
    fi
    case "$1" in
        activate)
            shift
            __conda_activate "$@"
            ;;
        deactivate)
            __conda_deactivate
            ;;
        *)
            "$CONDA_EXE" "$@"
            ;;
    esac
}

if [ -z "${CONDA_SHLVL:-}" ]; then
    export CONDA_SHLVL=0
    case ":$PATH:" in
        *":$_CONDA_ROOT/condabin:"*) ;;
        *) export PATH="$_CONDA_ROOT/condabin:$PATH" ;;
    esac
fi
