"""managedFields tracking for non-apply writes: fieldsV1 encoding, field sets and `update`.

Expected encodings are the ones a real cluster shows with
`kubectl get -o yaml --show-managed-fields`.
"""

from __future__ import annotations

import copy

import pytest

from socialweb_computer.apiserver import managedfields as mf
from socialweb_computer.apiserver import schemas

T0, T1, T2 = "2024-05-01T10:00:00Z", "2024-05-01T10:00:01Z", "2024-05-01T10:00:02Z"
CM = schemas.for_kind("", "v1", "ConfigMap")
DEPLOYMENT = schemas.for_kind("apps", "v1", "Deployment")


def configmap(data: dict | None = None, **meta) -> dict:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default", **meta},
    }
    if data is not None:
        obj["data"] = data
    return obj


def created_deployment() -> dict:
    """`kubectl create deployment nginx --image=nginx` after defaulting."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "nginx",
            "namespace": "default",
            "labels": {"app": "nginx"},
            "creationTimestamp": None,
        },
        "spec": {
            "progressDeadlineSeconds": 600,
            "replicas": 1,
            "revisionHistoryLimit": 10,
            "selector": {"matchLabels": {"app": "nginx"}},
            "strategy": {
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
                "type": "RollingUpdate",
            },
            "template": {
                "metadata": {"creationTimestamp": None, "labels": {"app": "nginx"}},
                "spec": {
                    "containers": [
                        {
                            "image": "nginx",
                            "imagePullPolicy": "Always",
                            "name": "nginx",
                            "resources": {},
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File",
                        }
                    ],
                    "dnsPolicy": "ClusterFirst",
                    "restartPolicy": "Always",
                    "schedulerName": "default-scheduler",
                    "securityContext": {},
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
        "status": {},
    }


def entries(obj: dict) -> list[dict]:
    return obj["metadata"].get("managedFields", [])


# --- fieldsV1 encoding -----------------------------------------------------------


def test_fields_v1_round_trip_with_keys_values_and_self_marker():
    wire = {
        "f:metadata": {
            "f:finalizers": {".": {}, 'v:"example.com/x"': {}},
            "f:labels": {".": {}, "f:app": {}},
        },
        "f:spec": {"f:ports": {'k:{"port":80,"protocol":"TCP"}': {".": {}, "f:port": {}}}},
        "f:args": {"i:0": {}},
    }
    fs = mf.FieldSet.from_fields_v1(wire)
    assert fs.to_fields_v1() == wire
    assert mf.field_path("metadata", "labels") in fs
    assert mf.field_path("spec") not in fs
    assert '.spec.ports[port=80,protocol="TCP"].port' in fs.strings()
    assert '.metadata.finalizers[="example.com/x"]' in fs.strings()


def test_fields_v1_orders_self_marker_first_then_fields_then_keys():
    fs = mf.FieldSet.from_fields_v1({"f:b": {}, "f:a": {"f:z": {}, ".": {}, "f:y": {}}})
    encoded = fs.to_fields_v1()
    assert list(encoded) == ["f:a", "f:b"]
    assert list(encoded["f:a"]) == [".", "f:y", "f:z"]


def test_fields_v1_keys_are_json_with_sorted_names_and_go_escaping():
    obj = {"spec": {"containers": [{"name": "a<b", "image": "x"}]}}
    t = mf.root_type(
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "containers": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {
                                "type": "object",
                                "properties": {"name": {"type": "string"}, "image": {"type": "string"}},
                            },
                        }
                    },
                }
            },
        }
    )
    encoded = mf.typed_field_set(obj, t).to_fields_v1()
    assert encoded == {
        "f:spec": {"f:containers": {'k:{"name":"a\\u003cb"}': {".": {}, "f:image": {}, "f:name": {}}}}
    }


def test_malformed_fields_v1_is_rejected():
    with pytest.raises(ValueError):
        mf.FieldSet.from_fields_v1({"x": {}})
    with pytest.raises(ValueError):
        mf.FieldSet.from_fields_v1({"k:notjson": {}})


def test_recursive_difference_drops_children():
    fs = mf.FieldSet([mf.field_path("status", "phase"), mf.field_path("spec", "x"), mf.field_path("status")])
    assert fs.recursive_difference(mf.FieldSet([mf.field_path("status")])) == mf.FieldSet(
        [mf.field_path("spec", "x")]
    )


# --- field_set -------------------------------------------------------------------


def test_field_set_of_an_apply_configuration():
    config = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nginx", "labels": {"app": "nginx"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "nginx"}},
            "template": {
                "metadata": {"labels": {"app": "nginx"}},
                "spec": {
                    "containers": [
                        {"name": "nginx", "image": "nginx:1.14.2", "ports": [{"containerPort": 80}]}
                    ]
                },
            },
        },
    }
    encoded = mf.field_set(config, DEPLOYMENT).to_fields_v1()
    assert encoded["f:metadata"] == {"f:labels": {"f:app": {}}, "f:name": {}}
    assert encoded["f:spec"]["f:selector"] == {}  # LabelSelector is an atomic map
    assert encoded["f:spec"]["f:template"]["f:spec"] == {
        "f:containers": {
            'k:{"name":"nginx"}': {
                ".": {},
                "f:image": {},
                "f:name": {},
                "f:ports": {'k:{"containerPort":80,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}},
            }
        }
    }


def test_field_set_of_custom_resource_without_schema_is_deduced():
    obj = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "labels": {"a": "b"}},
        "spec": {"size": 3, "tags": ["x", "y"], "nested": {"deep": True}},
    }
    encoded = mf.field_set(obj, None).to_fields_v1()
    assert encoded["f:spec"] == {".": {}, "f:nested": {".": {}, "f:deep": {}}, "f:size": {}, "f:tags": {}}
    assert encoded["f:metadata"]["f:labels"] == {"f:a": {}}


def test_custom_resource_schema_list_types_and_atomic_maps():
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "hosts": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "plain": {"type": "array", "items": {"type": "string"}},
                    "selector": {
                        "type": "object",
                        "x-kubernetes-map-type": "atomic",
                        "additionalProperties": {"type": "string"},
                    },
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }
        },
    }
    obj = {"spec": {"hosts": ["a", "b"], "plain": ["p"], "selector": {"k": "v"}, "free": {"x": {"y": 1}}}}
    assert mf.field_set(obj, schema).to_fields_v1() == {
        "f:spec": {
            "f:free": {"f:x": {".": {}, "f:y": {}}},
            "f:hosts": {'v:"a"': {}, 'v:"b"': {}},
            "f:plain": {},
            "f:selector": {},
        }
    }


# --- update ----------------------------------------------------------------------


def test_create_of_a_deployment_matches_kubectl_create_on_a_real_cluster():
    obj = created_deployment()
    mf.update(
        None,
        obj,
        manager="kubectl-create",
        api_version="apps/v1",
        now=T0,
        schema=DEPLOYMENT,
        reset_fields=["status"],
    )
    [entry] = entries(obj)
    assert {k: v for k, v in entry.items() if k != "fieldsV1"} == {
        "manager": "kubectl-create",
        "operation": "Update",
        "apiVersion": "apps/v1",
        "time": T0,
        "fieldsType": "FieldsV1",
    }
    assert entry["fieldsV1"] == {
        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
        "f:spec": {
            "f:progressDeadlineSeconds": {},
            "f:replicas": {},
            "f:revisionHistoryLimit": {},
            "f:selector": {},
            "f:strategy": {
                "f:rollingUpdate": {".": {}, "f:maxSurge": {}, "f:maxUnavailable": {}},
                "f:type": {},
            },
            "f:template": {
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {
                    "f:containers": {
                        'k:{"name":"nginx"}': {
                            ".": {},
                            "f:image": {},
                            "f:imagePullPolicy": {},
                            "f:name": {},
                            "f:resources": {},
                            "f:terminationMessagePath": {},
                            "f:terminationMessagePolicy": {},
                        }
                    },
                    "f:dnsPolicy": {},
                    "f:restartPolicy": {},
                    "f:schedulerName": {},
                    "f:securityContext": {},
                    "f:terminationGracePeriodSeconds": {},
                },
            },
        },
    }


def test_create_of_a_configmap_marks_new_maps_with_self():
    obj = configmap({"foo": "bar"})
    mf.update(None, obj, manager="kubectl-create", api_version="v1", now=T0, schema=CM)
    assert entries(obj)[0]["fieldsV1"] == {"f:data": {".": {}, "f:foo": {}}}


def test_never_tracked_metadata_fields():
    obj = configmap({"a": "1"}, uid="u", resourceVersion="5", generation=1, creationTimestamp=T0)
    mf.update(None, obj, manager="m", api_version="v1", now=T0, schema=CM)
    assert "f:metadata" not in entries(obj)[0]["fieldsV1"]


def test_update_takes_changed_fields_from_other_managers_and_drops_empty_entries():
    live = configmap({"a": "1"})
    mf.update(None, live, manager="creator", api_version="v1", now=T0, schema=CM)
    new = copy.deepcopy(live)
    new["data"]["a"] = "2"
    mf.update(live, new, manager="kubectl-edit", api_version="v1", now=T1, schema=CM)
    assert [(e["manager"], e["fieldsV1"]) for e in entries(new)] == [
        ("creator", {"f:data": {}}),
        ("kubectl-edit", {"f:data": {"f:a": {}}}),
    ]
    newer = copy.deepcopy(new)
    del newer["data"]
    mf.update(new, newer, manager="kubectl-edit", api_version="v1", now=T2, schema=CM)
    assert entries(newer) == []
    assert "managedFields" not in newer["metadata"]


def test_a_write_that_changes_nothing_keeps_the_old_time():
    live = configmap({"a": "1"})
    mf.update(None, live, manager="m", api_version="v1", now=T0, schema=CM)
    same = copy.deepcopy(live)
    mf.update(live, same, manager="m", api_version="v1", now=T1, schema=CM)
    assert entries(same) == entries(live)


def test_same_manager_entries_are_merged_and_re_timed():
    live = configmap({"a": "1"})
    mf.update(None, live, manager="m", api_version="v1", now=T0, schema=CM)
    new = copy.deepcopy(live)
    new["data"]["b"] = "2"
    mf.update(live, new, manager="m", api_version="v1", now=T1, schema=CM)
    [entry] = entries(new)
    assert entry["time"] == T1
    assert entry["fieldsV1"] == {"f:data": {".": {}, "f:a": {}, "f:b": {}}}


def test_client_supplied_managed_fields_are_honoured_and_empty_list_wipes_them():
    live = configmap({"a": "1"})
    mf.update(None, live, manager="m", api_version="v1", now=T0, schema=CM)
    supplied = {
        "manager": "someone",
        "operation": "Update",
        "apiVersion": "v1",
        "time": T0,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:data": {"f:a": {}}},
    }
    new = copy.deepcopy(live)
    new["metadata"]["managedFields"] = [supplied]
    mf.update(live, new, manager="m", api_version="v1", now=T1, schema=CM)
    assert entries(new) == [supplied]

    wiped = copy.deepcopy(live)
    wiped["metadata"]["managedFields"] = []
    wiped["data"]["a"] = "changed"
    mf.update(live, wiped, manager="m", api_version="v1", now=T1, schema=CM)
    assert "managedFields" not in wiped["metadata"]
    # An untracked object stays untracked until the next apply.
    later = copy.deepcopy(wiped)
    later["data"]["b"] = "2"
    mf.update(wiped, later, manager="m", api_version="v1", now=T2, schema=CM)
    assert "managedFields" not in later["metadata"]


def test_malformed_supplied_managed_fields_fall_back_to_live():
    live = configmap({"a": "1"})
    mf.update(None, live, manager="m", api_version="v1", now=T0, schema=CM)
    new = copy.deepcopy(live)
    new["metadata"]["managedFields"] = [{"manager": "x", "operation": "Bogus", "apiVersion": "v1"}]
    mf.update(live, new, manager="m", api_version="v1", now=T1, schema=CM)
    assert entries(new) == entries(live)


def test_status_subresource_write_does_not_touch_spec_ownership():
    live = created_deployment()
    mf.update(
        None,
        live,
        manager="kubectl-create",
        api_version="apps/v1",
        now=T0,
        schema=DEPLOYMENT,
        reset_fields=mf.reset_fields_for("", True),
    )
    new = copy.deepcopy(live)
    new["spec"]["replicas"] = 5  # reset for status writes: never owned by the status writer
    new["status"] = {"replicas": 1, "observedGeneration": 1}
    mf.update(
        live,
        new,
        manager="kube-controller-manager",
        api_version="apps/v1",
        now=T1,
        schema=DEPLOYMENT,
        subresource="status",
        reset_fields=mf.reset_fields_for("status", True),
    )
    creator, controller = entries(new)
    assert creator["fieldsV1"] == entries(live)[0]["fieldsV1"]
    assert controller == {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "apps/v1",
        "time": T1,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:observedGeneration": {}, "f:replicas": {}}},
        "subresource": "status",
    }


def test_main_resource_write_never_owns_status():
    live = created_deployment()
    mf.update(
        None, live, manager="c", api_version="apps/v1", now=T0, schema=DEPLOYMENT, reset_fields=["status"]
    )
    new = copy.deepcopy(live)
    new["status"] = {"replicas": 3}
    mf.update(
        live, new, manager="c", api_version="apps/v1", now=T1, schema=DEPLOYMENT, reset_fields=["status"]
    )
    assert entries(new) == entries(live)


def test_subresource_writes_ignore_client_managed_fields():
    live = configmap({"a": "1"})
    mf.update(None, live, manager="m", api_version="v1", now=T0, schema=CM)
    new = copy.deepcopy(live)
    new["metadata"]["managedFields"] = []
    mf.update(live, new, manager="m", api_version="v1", now=T1, schema=CM, subresource="status")
    assert entries(new) == entries(live)


def test_more_than_ten_updaters_are_folded_into_ancient_changes():
    obj = configmap({})
    mf.update(None, obj, manager="m0", api_version="v1", now="2024-05-01T10:00:00Z", schema=CM)
    for i in range(1, 12):
        new = copy.deepcopy(obj)
        new["data"][f"k{i}"] = "v"
        mf.update(obj, new, manager=f"m{i}", api_version="v1", now=f"2024-05-01T10:00:{i:02d}Z", schema=CM)
        obj = new
    managers = [e["manager"] for e in entries(obj)]
    assert len(managers) == 10
    assert managers[0] == "ancient-changes"
    # m0 created the empty map, m1 and m2 filled it: the three oldest share one bucket.
    assert entries(obj)[0]["fieldsV1"]["f:data"] == {".": {}, "f:k1": {}, "f:k2": {}}
    assert entries(obj)[0]["time"] == "2024-05-01T10:00:02Z"


def test_entries_sort_apply_first_then_by_time():
    raw = [
        {
            "manager": "b",
            "operation": "Update",
            "apiVersion": "v1",
            "time": T1,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:b": {}}},
        },
        {
            "manager": "a",
            "operation": "Update",
            "apiVersion": "v1",
            "time": T2,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:a": {}}},
        },
        {
            "manager": "z",
            "operation": "Apply",
            "apiVersion": "v1",
            "time": T2,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:z": {}}},
        },
    ]
    assert [e["manager"] for e in mf.encode(mf.decode(raw))] == ["z", "b", "a"]


def test_empty_manager_is_unknown():
    obj = configmap({"a": "1"})
    mf.update(None, obj, manager="", api_version="v1", now=T0, schema=CM)
    assert entries(obj)[0]["manager"] == "unknown"


@pytest.mark.parametrize(
    ("user_agent", "manager"),
    [
        ("kubectl/v1.37.1 (linux/amd64) kubernetes/abcdef", "kubectl"),
        ("OpenAPI-Generator/37.0.2/python", "OpenAPI-Generator"),
        ("Go-http-client/1.1", "Go-http-client"),
        ("", ""),
        ("a\x07b/1", "ab"),
        ("x" * 200, "x" * 128),
    ],
)
def test_default_manager_from_user_agent(user_agent, manager):
    assert mf.default_manager(user_agent) == manager


def test_list_map_items_missing_their_key_keep_the_live_entries():
    live = created_deployment()
    mf.update(
        None, live, manager="c", api_version="apps/v1", now=T0, schema=DEPLOYMENT, reset_fields=["status"]
    )
    new = copy.deepcopy(live)
    new["spec"]["template"]["spec"]["containers"].append({"image": "no-name"})
    mf.update(
        live, new, manager="d", api_version="apps/v1", now=T1, schema=DEPLOYMENT, reset_fields=["status"]
    )
    assert entries(new) == entries(live)
