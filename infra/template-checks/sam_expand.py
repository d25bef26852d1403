"""Reads a SAM template and prints {"raw": ..., "expanded": ...} as JSON.

"raw" is the template as written, with CloudFormation's short tags (!Ref, !GetAtt, ...)
turned into their long JSON forms. "expanded" is what CloudFormation would deploy after
the AWS::Serverless-2016-10-31 transform, produced by AWS's own translator
(aws-sam-translator, the library `sam validate` and CloudFormation use), so the
consistency tests judge the IAM policies SAM really generates, policy templates and
event-source permissions included.

Offline by construction: local CodeUris are replaced by a placeholder S3 URI (as
`sam validate` does), and the managed-policy loader answers from nothing, which is
enough because the template names no managed policy.

Parameter overrides (`Name=Value`, as `sam deploy --parameter-overrides` takes them) go
to the translator as `sam local` hands them over: SAM resolves some parameters itself
(a CorsConfiguration's origins, for one), so an override must reach it, not only the
stack that evaluates the rest.

Most parameters SAM leaves as `Ref`s, for CloudFormation to resolve. Which ones it reads
itself is found by probing: `--probe Name=Value` expands the template once with Name at a
probe value beside the others and compares; the answer lists the probed names that
changed the expansion ("sam_parameters"), and only those overrides are applied. A caller
that remembers the answer passes the rest straight to its own evaluation, and expands
once for every override set that differs only in parameters SAM does not read.

Usage: python sam_expand.py template.yaml [--probe Name=Value ...] [Name=Value ...]
(AWS_DEFAULT_REGION must be set)
"""

import copy
import json
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    """The translator asks IAM for managed policy ARNs only to resolve policies given by
    name; the template uses none, so an empty map is the faithful answer."""

    def load(self):
        return {}


# A value no parameter has by default, so that a parameter SAM reads changes the output.
PROBE_VALUE = "flashsale-sam-probe"


def main(path, overrides, probes):
    with open(path, encoding="utf-8") as handle:
        raw = yaml_parse(handle.read())
    deployable = copy.deepcopy(raw)
    for resource in deployable.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            code_uri = resource.get("Properties", {}).get("CodeUri")
            if isinstance(code_uri, str) and not code_uri.startswith("s3://"):
                resource["Properties"]["CodeUri"] = "s3://placeholder-bucket/placeholder-key"

    def expand(values):
        return transform(copy.deepcopy(deployable), values, NoManagedPolicies())

    sam_parameters = []
    if probes:
        # Each probe against the same expansion, so one parameter's answer is its own.
        unprobed = json.dumps(expand(overrides), sort_keys=True)
        for name in probes:
            probed = json.dumps(expand({**overrides, name: PROBE_VALUE}), sort_keys=True)
            if probed != unprobed:
                sam_parameters.append(name)
    expanded = expand({**overrides, **{name: probes[name] for name in sam_parameters}})
    json.dump(
        {"raw": raw, "expanded": expanded, "sam_parameters": sam_parameters},
        sys.stdout,
        indent=1,
        sort_keys=True,
    )
    sys.stdout.write("\n")


def name_value(argument):
    name, equals, value = argument.partition("=")
    if not equals or not name:
        sys.exit(f"sam_expand.py: parameter override {argument!r} is not Name=Value")
    return name, value


def arguments(rest):
    overrides, probes = {}, {}
    while rest:
        argument = rest.pop(0)
        if argument == "--probe":
            if not rest:
                sys.exit("sam_expand.py: --probe needs a Name=Value")
            name, value = name_value(rest.pop(0))
            probes[name] = value
        else:
            name, value = name_value(argument)
            overrides[name] = value
    return overrides, probes


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: sam_expand.py TEMPLATE [--probe Name=Value ...] [Name=Value ...]")
    main(sys.argv[1], *arguments(sys.argv[2:]))
