"""YAML read the way the CLI's libyaml tree reads it (common/yaml_json.h): every scalar kept
as text, so `9:28` is not a sexagesimal number and `on` is not a boolean; only nulls are
resolved. The spec reader converts each scalar by its field's type."""

import yaml


class TextLoader(yaml.SafeLoader):
    pass


TextLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load(text):
    return yaml.load(text, Loader=TextLoader)


def load_all(text):
    return list(yaml.load_all(text, Loader=TextLoader))
