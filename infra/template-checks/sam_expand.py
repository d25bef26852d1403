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

Usage: python sam_expand.py template.yaml [Name=Value ...]   (AWS_DEFAULT_REGION must be set)
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


def main(path, overrides):
    with open(path, encoding="utf-8") as handle:
        raw = yaml_parse(handle.read())
    deployable = copy.deepcopy(raw)
    for resource in deployable.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            code_uri = resource.get("Properties", {}).get("CodeUri")
            if isinstance(code_uri, str) and not code_uri.startswith("s3://"):
                resource["Properties"]["CodeUri"] = "s3://placeholder-bucket/placeholder-key"
    expanded = transform(deployable, overrides, NoManagedPolicies())
    json.dump({"raw": raw, "expanded": expanded}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def parameter_overrides(arguments):
    overrides = {}
    for argument in arguments:
        name, equals, value = argument.partition("=")
        if not equals or not name:
            sys.exit(f"sam_expand.py: parameter override {argument!r} is not Name=Value")
        overrides[name] = value
    return overrides


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: sam_expand.py TEMPLATE [Name=Value ...]")
    main(sys.argv[1], parameter_overrides(sys.argv[2:]))
