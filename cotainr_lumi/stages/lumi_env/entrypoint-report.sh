# cotainr-lumi: print the marker line, then this process's environment, one
# NAME=VALUE a line (a value with a newline: NAME alone). Run by /bin/sh as
# the command of the image's runscript, which prepares the environment first
# (cotainr_lumi/stages/lumi_env/entrypoint.py). Shell state is left out.
echo cotainr-lumi-entrypoint-env
_cl_nl='
'
IFS=$_cl_nl
set -f
for _cl_line in $(export -p); do
    _cl_n=${_cl_line#export }
    _cl_n=${_cl_n%%=*}
    case $_cl_n in
    '' | [0-9]* | *[!A-Za-z0-9_]* | _ | SHLVL | PWD | OLDPWD) continue ;;
    esac
    eval "_cl_set=\${$_cl_n+x} _cl_v=\${$_cl_n-}"
    case $_cl_set$_cl_v in
    x*"$_cl_nl"*) printf '%s\n' "$_cl_n" ;;
    x*) printf '%s=%s\n' "$_cl_n" "$_cl_v" ;;
    esac
done
