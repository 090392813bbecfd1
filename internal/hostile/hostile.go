// Package hostile builds forged AdmissionReviews of about 1 MiB (just under
// the webhook's body limit), one per shape of what an attacker can stuff into
// a review, for the tests that bound nodeguard's memory under them: each
// shape costs a naive decoder many times its bytes.
package hostile

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Shapes are the hostile reviews, by name.
var Shapes = []string{"empty-objects", "groups", "extra", "annotations", "managed-fields", "deep"}

// Review is a DELETE review of Node name by user mallory in the given shape;
// i makes the users of one shape differ, so no two share a decision.
func Review(shape, name string, i int) []byte {
	node := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}
	user := map[string]any{"username": fmt.Sprintf("mallory-%d", i)}
	var raw json.RawMessage
	switch shape {
	case "empty-objects": // 340,000 empty objects: ~180 MB as Unstructured maps
		raw = json.RawMessage(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `"},"spec":{"taints":[` +
			strings.TrimSuffix(strings.Repeat("{},", 340_000), ",") + `]}}`)
	case "groups": // 95,000 groups: a string each
		groups := make([]string, 95_000)
		for j := range groups {
			groups[j] = fmt.Sprintf("%d-%d", i, j)
		}
		user["groups"] = groups
	case "extra": // userInfo.extra: 20,000 keys of short values and one long value
		extra := map[string]any{}
		for j := range 20_000 {
			extra[fmt.Sprintf("example.com/key-%d-%05d", i, j)] = []string{"v", "w"}
		}
		extra["example.com/long"] = []string{strings.Repeat("x", 300<<10)}
		user["extra"] = extra
	case "annotations": // one Node annotation of ~1 MiB
		node["metadata"].(map[string]any)["annotations"] = map[string]any{"example.com/blob": strings.Repeat("a", 1000<<10)}
	case "managed-fields": // managedFields with 60,000 field entries
		fields := map[string]any{}
		for j := range 60_000 {
			fields[fmt.Sprintf("f:k%05d", j)] = map[string]any{}
		}
		node["metadata"].(map[string]any)["managedFields"] = []any{map[string]any{"manager": "mallory", "operation": "Update",
			"fieldsType": "FieldsV1", "fieldsV1": map[string]any{"f:metadata": fields}}}
	case "deep": // lists nested 9,000 deep (encoding/json allows 10,000), 100 times
		deep := strings.Repeat("[", 9_000) + strings.Repeat("]", 9_000)
		raw = json.RawMessage(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `"},"spec":{"taints":[` +
			strings.TrimSuffix(strings.Repeat(deep+",", 55), ",") + `]}}`)
	default:
		panic("hostile: no shape " + shape)
	}
	if raw == nil {
		raw, _ = json.Marshal(node)
	}
	b, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": fmt.Sprintf("hostile-%s-%d", shape, i), "operation": "DELETE", "name": name,
			"kind":      map[string]any{"group": "", "version": "v1", "kind": "Node"},
			"resource":  map[string]any{"group": "", "version": "v1", "resource": "nodes"},
			"oldObject": raw, "userInfo": user}})
	return b
}
