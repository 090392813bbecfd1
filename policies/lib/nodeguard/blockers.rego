# What a found object is to a denial: a blocker (it exists, deleting or not),
# or, for a Machine whose InfraMachine kind is not synced, an unverified kind.
package lib.nodeguard

_blocker(key, found, links) := object.union(key, {
	"version": found.version,
	"deleting": _deleting(found.obj),
	"links": _links_of(links, key),
})

# The inventory keys objects by groupVersion; a reference's version may differ
# from the synced one, so match on group and take the lowest synced version
# when several are synced. [] when nothing is synced under the key.
_lookup(inventory, key) := [{"version": version, "obj": inventory.namespace[key.namespace][gv][key.kind][key.name]}] if {
	synced := {[_version(gv), gv] |
		some gv
		inventory.namespace[key.namespace][gv][key.kind][key.name]
		_group(gv) == key.group
	}
	count(synced) > 0
	[version, gv] := min(synced)
} else := []

_version(gv) := split(gv, "/")[1] if {
	contains(gv, "/")
} else := gv

# An object a referrer references that is absent proves nothing when its
# kind is not synced (as an InfraMachine or a pool kind): deny unless the
# parameters opt out. (Only a referrer's link can name an object that is
# absent: the others found it.)
_unverified(found, links, params) := [] if {
	params.allowUnverifiedKinds == true
} else := [object.union(key, {"links": _links_of(links, key)}) |
	some key, hits in found
	hits == []
	not _synced(key, params.infraMachineKinds)
	not _synced(key, params.infraMachinePoolKinds)
]

# Sets iterate in sorted order, so the links of a key come out stable.
_links_of(links, key) := [link | some [k, link] in links; k == key]

_deleting(obj) if {
	object.get(obj, object_fields.deletion_timestamp, false) != false
} else := false

_synced(key, kinds) if {
	some kind in kinds
	kind.group == key.group
	kind.kind == key.kind
}
