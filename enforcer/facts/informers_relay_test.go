package facts_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/nodeguard/nodeguard/enforcer/facts"
)

// Changes sent before Connect, and while it delivers them, reach the
// subscriber once each and in the order sent.
func TestRelayKeepsOrder(t *testing.T) {
	var r facts.Relay
	var mu sync.Mutex
	var got []facts.Role
	for range 1000 {
		r.Send(facts.Change{Role: facts.Machine})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1000 {
			r.Send(facts.Change{Role: facts.InfraMachine})
		}
	}()
	r.Connect(func(c facts.Change) {
		mu.Lock()
		got = append(got, c.Role)
		mu.Unlock()
	})
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, got, 2000)
	for i := range 1000 {
		assert.Equal(t, facts.Machine, got[i], "the changes kept come first")
	}
	for _, role := range got[1000:] {
		assert.Equal(t, facts.InfraMachine, role)
	}
}
