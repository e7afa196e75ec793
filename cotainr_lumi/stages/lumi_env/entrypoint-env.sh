# cotainr-lumi: exec, shell and the runscripts get the environment the image's
# runscript prepares before it runs its command, as `run` gets it (for an OCI
# image the runscript runs its ENTRYPOINT). At each start but run's, the
# runscript is run with @REPORTER@ as its command; the variables it set,
# changed or removed are applied here. `run` runs the runscript itself.
# (No line of text is a pattern: Apptainer's shell matches those with Go
# regular expressions, which are slow for long patterns on long text.)
case "${__apptainer_cmd__-}${__singularity_cmd__-}" in
run) ;;
*)
    _cl_nl='
'
    _cl_ep=$(
        IFS=$_cl_nl
        set -f
        # The host's variables, hidden from env scripts, as run passes them.
        for _cl_kv in ${__exported_env__-}; do
            case ${_cl_kv%%=*} in
            '' | [0-9]* | *[!A-Za-z0-9_]*) ;;
            *) eval "[ -n \"\${${_cl_kv%%=*}+x}\" ]" || export "$_cl_kv" ;;
            esac
        done
        _cl_before=$(/bin/sh @REPORTER@)
        _cl_after=$(@RUNSCRIPT@ /bin/sh @REPORTER@) || _cl_after=
        case $_cl_after in
        "cotainr-lumi-entrypoint-env$_cl_nl"*) ;;
        *)
            echo "cotainr-lumi: @RUNSCRIPT@ did not run its command:" \
                "exec does not get the environment it prepares" >&2
            _cl_before=$_cl_after
            ;;
        esac
        _cl_names=$_cl_nl
        for _cl_kv in $_cl_after; do # set or changed: not the value here
            _cl_names=$_cl_names${_cl_kv%%=*}$_cl_nl
            case $_cl_kv in *=*) ;; *) continue ;; esac # the marker, NAME alone
            case ${_cl_kv%%=*} in '' | [0-9]* | *[!A-Za-z0-9_]*) continue ;; esac
            eval "_cl_had=\${${_cl_kv%%=*}+x} _cl_old=\${${_cl_kv%%=*}-}"
            if [ -z "$_cl_had" ] || [ "$_cl_old" != "${_cl_kv#*=}" ]; then
                printf '%s\n' "$_cl_kv"
            fi
        done
        for _cl_kv in $_cl_before; do # removed: gone from its report
            case $_cl_names in
            *"$_cl_nl${_cl_kv%%=*}$_cl_nl"*) ;;
            *) printf '%s\n' "-${_cl_kv%%=*}" ;;
            esac
        done
    )
    _cl_ifs=$IFS
    IFS=$_cl_nl
    set -f
    for _cl_kv in $_cl_ep; do
        _cl_n=${_cl_kv#-}
        case ${_cl_n%%=*} in
        '' | [0-9]* | *[!A-Za-z0-9_]* | _cl_* | __* | @SKIP@) ;;
        *)
            case $_cl_kv in
            -*) # Removed; empty and not exported, so no host value comes back.
                unset "$_cl_n"
                eval "$_cl_n="
                ;;
            *=*) export "$_cl_kv" ;;
            esac
            ;;
        esac
    done
    set +f
    IFS=$_cl_ifs
    unset _cl_ep _cl_kv _cl_n _cl_nl _cl_ifs
    ;;
esac
