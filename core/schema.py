r"""JSON Schemas for hardware profile and fabric files (``core/profiles``, ``core/fabrics``).

Every environment setting is ``{value, why}``: the reason is data, rendered as a
comment next to the variable in every script and manifest.

Patterns end in ``\Z``, never ``$``: jsonschema matches them with ``re.search``, where ``$`` also
matches before a final newline (``"NAME\n"`` would pass ``^[A-Z_]+$``). Lists and maps are
bounded and carry no ``uniqueItems`` (jsonschema compares maps pairwise: quadratic in a hostile
file); ``catalog`` checks the enum lists for repeats in one pass after validation.
"""

from core.limits import MAX_BUSBW_GBPS, MAX_CPUS_PER_NODE, MAX_NPROC_PER_NODE

ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*\Z"
MAX_ENV_ENTRIES = 512  # variables in one env map
MAX_LIST_ITEMS = 64  # notes, devices

ENV_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["value", "why"],
    "properties": {
        # A string, or null when the value is site-specific and must come from the
        # user through the CLI option named in ``option`` (rendering fails otherwise).
        "value": {"type": ["string", "null"]},
        "why": {"type": "string", "minLength": 10},
        "option": {"type": "string", "pattern": r"^--[a-z0-9-]+\Z"},
    },
}

ENV_MAP = {
    "type": "object",
    "maxProperties": MAX_ENV_ENTRIES,
    "propertyNames": {"pattern": ENV_NAME_PATTERN},
    "additionalProperties": ENV_ENTRY,
}

# a Kubernetes quantity with its reason (the pod's CPU and memory request); launch checks the quantity
K8S_QUANTITY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["value", "why"],
    "properties": {"value": {"type": "string", "maxLength": 64}, "why": {"type": "string", "minLength": 10}},
}

NOTES = {"type": "array", "maxItems": MAX_LIST_ITEMS, "items": {"type": "string", "minLength": 1}}

PROFILE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "launch hardware profile",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "description",
        "gpu",
        "cpu_arch",
        "interconnect",
        "fp8",
        "image_target",
        "default_fabric",
        "env",
    ],
    "properties": {
        "description": {"type": "string", "minLength": 1},
        "gpu": {
            "type": "object",
            "additionalProperties": False,
            "required": ["model", "arch", "gpus_per_node"],
            "properties": {
                "model": {"type": "string"},
                "arch": {"type": "string", "pattern": r"^(sm_[0-9]+a?|any)\Z"},
                "gpus_per_node": {"type": "integer", "minimum": 1, "maximum": MAX_NPROC_PER_NODE},
                "memory_gb": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
            },
        },
        "cpu_arch": {"enum": ["amd64", "arm64"]},
        "cpus_per_node": {"type": "integer", "minimum": 1, "maximum": MAX_CPUS_PER_NODE},
        "interconnect": {
            "type": "object",
            "additionalProperties": False,
            "required": ["summary", "nvlink", "nvswitch", "multi_node_nvlink"],
            "properties": {
                "summary": {"type": "string"},
                "nvlink": {"type": "boolean"},
                "nvswitch": {"type": "boolean"},
                "multi_node_nvlink": {"type": "boolean"},
            },
        },
        "fp8": {
            "type": "array",
            "maxItems": 3,  # each once (catalog checks)
            "items": {"enum": ["e4m3", "e5m2", "mxfp8"]},
        },
        "fp4": {
            "type": "array",
            "maxItems": 2,  # each once (catalog checks)
            "items": {"enum": ["nvfp4", "mxfp4"]},
        },
        "image_target": {"enum": ["hopper", "blackwell"]},
        "default_fabric": {
            "type": "object",
            "additionalProperties": False,
            "required": ["single_node", "multi_node"],
            "properties": {
                "single_node": {"type": "string"},
                "multi_node": {"type": "string"},
            },
        },
        "env": ENV_MAP,
        # environment for jobs that get an IMEX domain (a Kubernetes ComputeDomain), e.g. MNNVL
        "compute_domain_env": ENV_MAP,
        "k8s": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "node_selector": {
                    "type": "object",
                    "maxProperties": MAX_LIST_ITEMS,
                    "additionalProperties": {"type": "string"},
                },
                # per node (one trainer pod per node); --cpus / --memory override them
                "resources": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"cpu": K8S_QUANTITY, "memory": K8S_QUANTITY},
                },
            },
        },
        "notes": NOTES,
    },
}

FABRIC_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "launch network fabric",
    "type": "object",
    "additionalProperties": False,
    "required": ["description", "scope", "transport", "env"],
    "properties": {
        "description": {"type": "string", "minLength": 1},
        "scope": {"enum": ["single-node", "multi-node"]},
        "transport": {"enum": ["nvlink", "pcie", "infiniband", "roce", "socket", "efa"]},
        "requires_nvlink": {"type": "boolean"},
        "env": ENV_MAP,
        # the all-reduce busbw a healthy fabric gives (GB/s); `launch --preflight` refuses to train below
        # --preflight-min-fraction of it
        "busbw_GBps": {
            "type": "object",
            "additionalProperties": False,
            "required": ["value", "why"],
            "properties": {
                "value": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_BUSBW_GBPS},  # finite: 1e309 is inf
                "why": {"type": "string", "minLength": 10},
            },
        },
        "docker": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "devices": {"type": "array", "maxItems": MAX_LIST_ITEMS,
                            "items": {"type": "string", "pattern": r"^(/dev)(/[A-Za-z0-9_:-][A-Za-z0-9_.:-]*)+\Z"}},
                "cap_add": {"type": "array", "maxItems": 1, "items": {"enum": ["IPC_LOCK"]}},
            },
        },
        "k8s": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "rdma_resource": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "count", "why"],
                    "properties": {
                        "name": {"type": "string", "pattern": r"^[a-z0-9.-]+/[A-Za-z0-9._-]+\Z"},
                        # null: the count is site-specific; --rdma-resource NAME=COUNT is required
                        "count": {"type": ["integer", "null"], "minimum": 1, "maximum": 1 << 16},
                        "why": {"type": "string", "minLength": 10},
                    },
                },
                "ipc_lock": {"type": "boolean"},
            },
        },
        "notes": NOTES,
    },
}
