package informers_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/nodeguard/nodeguard/enforcer/informers"
	"github.com/nodeguard/nodeguard/enforcer/inventory"
)

// Changes sent before Connect, and while it delivers them, reach the
// subscriber once each and in the order sent.
func TestRelayKeepsOrder(t *testing.T) {
	var r informers.Relay
	var mu sync.Mutex
	var got []inventory.Role
	for range 1000 {
		r.Send(informers.Change{Role: inventory.Machine})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1000 {
			r.Send(informers.Change{Role: inventory.InfraMachine})
		}
	}()
	r.Connect(func(c informers.Change) {
		mu.Lock()
		got = append(got, c.Role)
		mu.Unlock()
	})
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, got, 2000)
	for i := range 1000 {
		assert.Equal(t, inventory.Machine, got[i], "the changes kept come first")
	}
	for _, role := range got[1000:] {
		assert.Equal(t, inventory.InfraMachine, role)
	}
}
