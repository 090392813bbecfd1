package admission_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/admission"
)

// FuzzValidate feeds arbitrary bodies to /validate: the handler must never
// panic, must answer 200 only to a review (as far as it reads one: a field
// it never reads may hold anything) with a response for the request's uid, and must
// never allow the delete of the linked Node to a user who is not exempt, nor
// a Node delete without oldObject to anyone (the rule's own denial).
// The seeds run with every `go test`; `go test -fuzz FuzzValidate` explores.
func FuzzValidate(f *testing.F) {
	g, _, nodes := example(f)
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g})
	node := nodes[linkedNode].Object
	f.Add(review(admissionv1.Delete, "Node", node))
	f.Add(review(admissionv1.Delete, "Node", node, "ops"))
	f.Add(review(admissionv1.Update, "Node", node))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"DELETE","kind":{"kind":"Node"},"oldObject":null}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"DELETE","kind":{"kind":"Node"},"oldObject":{"apiVersion":"v1","kind":"Node","metadata":{"name":7}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"DELETE","kind":{"kind":"Node"},"userInfo":{"groups":["ops"]}}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/validate", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			return
		}
		// A review as far as the handler reads one: the fields it never reads
		// (resource, options, the object of a DELETE) may hold anything.
		var in struct {
			Request *struct {
				UID       types.UID               `json:"uid"`
				Kind      metav1.GroupVersionKind `json:"kind"`
				Name      string                  `json:"name"`
				Operation admissionv1.Operation   `json:"operation"`
				UserInfo  struct {
					Username string   `json:"username"`
					Groups   []string `json:"groups"`
				} `json:"userInfo"`
				OldObject runtime.RawExtension `json:"oldObject"`
				DryRun    *bool                `json:"dryRun"`
			} `json:"request"`
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
			t.Fatalf("200 for a body that is not a review: %q", body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("200 without a response: %q", rec.Body.String())
		}
		if out.Response.UID != in.Request.UID {
			t.Fatalf("response uid %q for request uid %q", out.Response.UID, in.Request.UID)
		}
		var old struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		_ = json.Unmarshal(in.Request.OldObject.Raw, &old)
		exempt := false
		for _, g := range in.Request.UserInfo.Groups {
			exempt = exempt || g == "ops"
		}
		nodeDelete := in.Request.Operation == admissionv1.Delete && in.Request.Kind.Group == "" && in.Request.Kind.Kind == "Node"
		if nodeDelete && old.Metadata.Name == linkedNode && !exempt && out.Response.Allowed {
			t.Fatalf("allowed the delete of the linked Node: %q", body)
		}
		// The rule cannot judge a Node it does not see: denied, exempt or not.
		if nodeDelete && len(in.Request.OldObject.Raw) == 0 && out.Response.Allowed {
			t.Fatalf("allowed a Node delete without oldObject: %q", body)
		}
	})
}
