package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNotStreamingCountsEveryStateButStreamingAndSplit(t *testing.T) {
	require.Equal(t, 4, notStreaming(map[string]int{"Streaming": 5, "Retrying": 1, "NoEligibleReplica": 2, "Split": 3, "Expired": 1}))
	require.Zero(t, notStreaming(map[string]int{"Streaming": 3}))
	require.Zero(t, notStreaming(nil))
}
