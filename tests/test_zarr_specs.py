"""The zarr 3 codec specs in docs/zarr/ (zarr-extensions' form: a folder per codec name
with README.md and schema.json) agree with the codecs: every name has both, the schema
accepts the configs the codecs write and rejects the ones they refuse, and the README
names every member the schema allows."""

from __future__ import annotations

import inspect
import json
import pathlib

import pytest
import zarr
from tensorpress.compress import get_codec
from tensorpress.formats.zarr_codecs import SERIALIZERS
from tensorpress.zarr import SZ, Block, Quant, Zstd

jsonschema = pytest.importorskip("jsonschema")

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
SPECS = DOCS / "zarr"
STAGE = [{"id": "zstd", "level": 5, "checksum": True}]

#: configs the codecs write: each must satisfy its schema
WRITTEN = [
    SZ(abs=1e-3),
    SZ(rel=1e-3, predictor="lorenzo", level=5, radius=1024),
    SZ(rel=1e-3, value_range=(-3.5, 9.0), missing=[-999.0, 1e20]),
    SZ(psnr=70, value_range=(0, 1), alpha=1.5, beta=4, stages=STAGE),
    SZ(pw_rel=1e-2),
    SZ(abs=1e-3, valid_range=(0, None), missing=[1e20]),
    Block(abs=0.5, entropy="zstd"),
    Block(rel=1e-2, stochastic=True, seed=12),
    Block(psnr=40.0, value_range=(2, 3), missing=-1),
    Quant(),
    Quant(bits=2, group=4096, stochastic=True, seed=7, hadamard=True, stages=STAGE),
    Zstd(),
    Zstd(level=-7, shuffle=False, missing=[0.0]),
]

#: configurations the codecs refuse: each must fail its schema too
REFUSED = [
    ("tensorpress.sz", {}),
    ("tensorpress.sz", {"abs": 1e-3, "rel": 1e-3}),
    ("tensorpress.sz", {"abs": -1}),
    ("tensorpress.sz", {"psnr": 60}),
    ("tensorpress.sz", {"abs": 1e-3, "value_range": [0, 1], "resolved_abs": 1e-3}),
    ("tensorpress.sz", {"rel": 1e-3, "resolved_abs": 1e-3}),
    ("tensorpress.sz", {"abs": 1e-3, "predictor": "nope"}),
    ("tensorpress.sz", {"abs": 1e-3, "radius": 1}),
    ("tensorpress.sz", {"abs": 1e-3, "colour": "red"}),
    ("tensorpress.sz", {"rel": 1e-3, "value_range": [0]}),
    ("tensorpress.sz", {"abs": 1e-3, "valid_range": [0]}),
    ("tensorpress.block", {"abs": 1e-3, "valid_range": ["0", 1]}),
    ("tensorpress.zstd", {"valid_range": [0, 1]}),
    ("tensorpress.block", {"abs": 1e-3, "entropy": "huffman"}),
    ("tensorpress.block", {"abs": 1e-3, "seed": -1}),
    ("tensorpress.quant", {"bits": 3}),
    ("tensorpress.quant", {"group": 100}),
    ("tensorpress.quant", {"abs": 1e-3}),
    ("tensorpress.zstd", {"level": 23}),
    ("tensorpress.zstd", {"rel": 1e-3}),
    ("tensorpress.zstd", {"missing": "-999"}),
]


def _schema(name: str) -> dict:
    return json.loads((SPECS / name / "schema.json").read_text())


@pytest.mark.parametrize("name", sorted(SERIALIZERS))
def test_every_codec_name_has_a_readme_and_a_valid_schema(name):
    readme = (SPECS / name / "README.md").read_text()
    assert f"The value of the `name` member in the codec object MUST be `{name}`." in readme
    for heading in ("## Configuration parameters", "## Example", "## Format and algorithm"):
        assert heading in readme, f"{name}: no {heading!r}"
    schema = _schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    example = json.loads(readme.split("```json\n", 1)[1].split("```", 1)[0])
    jsonschema.validate(example["codecs"][0], schema)
    assert zarr.registry.get_codec_class(name).from_dict(example["codecs"][0]).to_dict()


@pytest.mark.parametrize("name", sorted(SERIALIZERS))
def test_the_readme_names_every_member_the_schema_allows(name):
    readme = (SPECS / name / "README.md").read_text()
    obj = _schema(name)["anyOf"][0]
    members = obj["properties"]["configuration"]["properties"]
    missing = [m for m in members if f"`{m}`" not in readme]
    assert not missing, f"{name}: README does not describe {missing}"


@pytest.mark.parametrize("name", sorted(SERIALIZERS))
def test_the_schema_allows_every_parameter_of_the_codec(name):
    """A parameter added to a codec needs its place in the spec: the keywords of the
    codec class's constructor are members of the schema's configuration."""
    cls = type(get_codec(name.split(".")[1]))
    params = inspect.signature(cls.__init__).parameters.values()
    keywords = {
        p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
    }
    members = _schema(name)["anyOf"][0]["properties"]["configuration"]["properties"]
    assert keywords - {"self"} <= set(members)


@pytest.mark.parametrize("codec", WRITTEN, ids=repr)
def test_written_configs_satisfy_the_schema(codec):
    d = json.loads(json.dumps(codec.to_dict()))
    jsonschema.validate(d, _schema(d["name"]))


@pytest.mark.parametrize(("name", "configuration"), REFUSED, ids=lambda v: json.dumps(v))
def test_refused_configs_fail_the_schema_and_the_codec(name, configuration):
    d = {"name": name, "configuration": configuration}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, _schema(name))
    with pytest.raises(ValueError):
        SERIALIZERS[name].from_dict(d)


def test_formats_page_links_every_spec():
    page = (DOCS / "formats.md").read_text()
    for name in SERIALIZERS:
        assert f"(zarr/{name}/README.md)" in page
