// Package admission answers over HTTPS and writes the configurations that
// point at those answers: the validating webhook (/validate, /register), the
// external data provider Gatekeeper asks, the intake that bounds every
// request, the TLS server and health probes, the ValidatingWebhookConfiguration
// and Gatekeeper Provider, and the ValidatingAdmissionPolicy of mode
// admission-policy.
//
// It must not judge a Node itself: every verdict comes from the guard.
package admission
