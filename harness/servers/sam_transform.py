"""Transforms template.yaml with the SAM translator, offline, and prints the
CloudFormation template (JSON) that CloudFormation would receive: the IAM roles SAM
creates or attaches are visible there, not in the file.

Usage: sam_transform.py TEMPLATE [Name=Value ...]  (parameters without a default)
"""

import json
import os
import sys

import yaml
from samtranslator.translator.transform import transform

# The translator adds pseudo parameters (AWS::Region, ...) from the boto session.
os.environ.setdefault("AWS_DEFAULT_REGION", "eu-west-1")


class CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags (!Ref, !GetAtt, !Sub, ...)."""


def _tag(loader, suffix, node):
    name = "Ref" if suffix == "Ref" else "Fn::" + suffix
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


CfnLoader.add_multi_constructor("!", _tag)
# CloudFormation reads `Version: 2012-10-17` as a string, not a date.
CfnLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node)
)


class NoManagedPolicies:
    """No AWS account here: a template that names managed policies by name fails."""

    def load(self):
        return {}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        template = yaml.load(f, Loader=CfnLoader)
    parameters = dict(arg.split("=", 1) for arg in sys.argv[2:])
    # `sam package` uploads local code and writes its S3 URI: do the same, offline.
    for resource in template.get("Resources", {}).values():
        props = resource.get("Properties") or {}
        if resource.get("Type") == "AWS::Serverless::Function" and isinstance(
            props.get("CodeUri"), str
        ) and not props["CodeUri"].startswith("s3://"):
            props["CodeUri"] = "s3://packaged-code/charge-once.zip"
    output = transform(template, parameters, NoManagedPolicies())
    json.dump(output, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
