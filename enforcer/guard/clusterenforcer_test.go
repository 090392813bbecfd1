package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/nodeguard/nodeguard/enforcer/guard"
)

func TestWaitReady(t *testing.T) {
	ctx := context.Background()
	calls := 0
	assert.NoError(t, guard.WaitReady(ctx, func() error {
		if calls++; calls < 3 {
			return errors.New("waiting")
		}
		return nil
	}, 5*time.Second))
	assert.Equal(t, 3, calls)

	err := guard.WaitReady(ctx, func() error { return errors.New("waiting for DockerMachine") }, 120*time.Millisecond)
	assert.ErrorContains(t, err, "caches not synced after 120ms: waiting for DockerMachine")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, guard.WaitReady(cancelled, func() error { return errors.New("waiting") }, time.Minute), context.Canceled)
}
