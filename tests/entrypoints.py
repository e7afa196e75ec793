"""The LUMI AI Factory entry points, written from their artefacts' facts.

``tests/artefacts/laifs-entrypoint-RELEASE.yaml`` states each release's form:
shebang, the variables set and the conditions on them, the final
``exec "$@"``. :func:`script` writes the script those facts describe (never
a form that fits cotainr-lumi's code); :func:`expected` is what it sets in a
given environment, for assertions.
"""

import artefacts

#: The releases whose entry-point forms are recorded (April, May, August 2026).
RELEASES = ("20260415", "20260513", "20260807")


def facts(release):
    """The facts of one release's form (``same-as`` followed)."""
    found = artefacts.load(f"laifs-entrypoint-{release}").facts
    if "same-as" in found:
        return facts(found["same-as"])
    return found


def _test(condition):
    name = condition["var"]
    if condition.get("is") == "":
        return f'[ -z "${{{name}}}" ]'
    if condition.get("not") == "":
        return f'[ -n "${{{name}}}" ]'
    return f'[ "${{{name}}}" = {condition["is"]} ]'


def _value(value):
    if "literal" in value:
        return value["literal"]
    if "from" in value:
        return f'"${value["from"]}"'
    # 0..N-1 for the N entries of a comma list (seq and awk, as the recipe).
    count = f'$(printf "%s\\n" "${value["indexes-of"]}" | awk -F, "{{print NF}}")'
    return f"$(seq -s , 0 $(({count} - 1)))"


def script(release):
    """The text of the release's entry point (or SIF runscript)."""
    form = facts(release)
    lines = [form["shebang"]]
    for assignment in form["sets"]:
        lines.append("if " + " && ".join(map(_test, assignment["when"])) + "; then")
        lines.append(f"    export {assignment['name']}={_value(assignment['value'])}")
        lines.append("fi")
    return "\n".join([*lines, form["ends"]]) + "\n"


def _holds(condition, env):
    value = env.get(condition["var"], "")
    if "not" in condition:
        return value != condition["not"]
    return value == condition["is"]


def expected(release, env):
    """The variables the release's entry point sets when started in `env`."""
    env, changed = dict(env), {}
    for assignment in facts(release)["sets"]:
        if not all(_holds(c, env) for c in assignment["when"]):
            continue
        value = assignment["value"]
        if "literal" in value:
            new = value["literal"]
        elif "from" in value:
            new = env.get(value["from"], "")
        else:
            count = len(env[value["indexes-of"]].split(","))
            new = ",".join(map(str, range(count)))
        env[assignment["name"]] = changed[assignment["name"]] = new
    return changed
