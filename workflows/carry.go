package workflows

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// The state a stream carries across continue-as-new rides in one payload,
// which the server refuses over 2 MB (failing the workflow task, and so
// the stream). At thousands of tablets the rows alone encode to MBs, more
// with long reasons and errors
// (TestAStreamOfTenThousandTabletsContinuesAsNewWellUnder2MB measures
// them). So the carried state is kept small:
//   - an ended tablet's row keeps what its status shows (compact);
//   - a state that encodes to more than packAbove rides gzip-packed
//     (StreamState's MarshalJSON): rows of the same shape, states and
//     aliases compress well;
//   - a packed state still over carryBudget sheds its rows' texts, in
//     steps, the running tablets' first (fitCarry): they report them
//     again on their next state change.
const (
	packAbove   = 256 << 10
	carryBudget = 1 << 20
)

// compact keeps the state carried across continue-as-new small: a tablet
// that has ended keeps what its status row needs, not its exclusions,
// errors or slot statistics, and no pause intent unless it can be
// retried (Failed).
func (s *stream) compact() {
	for _, t := range s.st.Tablets {
		if terminal(t.State) {
			t.Excluded, t.LastError, t.Slot = nil, "", nil
		}
	}
	s.st.Paused = slices.DeleteFunc(s.st.Paused, func(id string) bool {
		t := s.st.Tablets[id]
		return t == nil || (terminal(t.State) && t.State != Failed)
	})
}

// shedSteps are what fitCarry takes off the rows, in order, until the
// state fits carryBudget: first from the running tablets' rows (a
// running tablet reports its reason and error again at its next state
// change), then from the ended ones' (which never report again).
var shedSteps = []func(t *TabletStatus, ended bool){
	// Running: the reason cut short, no last error, no automatic
	// exclusions (the tablet keeps its own list).
	func(t *TabletStatus, ended bool) {
		if !ended {
			t.Reason, t.LastError, t.Excluded = truncate(t.Reason, 64), "", nil
		}
	},
	// Ended: the reason cut short.
	func(t *TabletStatus, ended bool) {
		if ended {
			t.Reason = truncate(t.Reason, 64)
		}
	},
	// No reasons.
	func(t *TabletStatus, _ bool) { t.Reason = "" },
}

// fitCarry sheds texts from the rows, step by step, while the state
// encodes to more than carryBudget. The size is measured with the
// fastest compression, which the carried state's only betters.
func (s *stream) fitCarry() {
	for step := 0; step < len(shedSteps); step++ {
		b, err := encodeState(*s.st, gzip.BestSpeed)
		if err != nil || len(b) <= carryBudget {
			return
		}
		s.log.Warn("the state carried across continue-as-new is over its budget: rows shed text", "size", len(b), "budget", carryBudget, "step", step+1)
		for _, id := range s.tabletIDs() {
			t := s.st.Tablets[id]
			shedSteps[step](t, terminal(t.State))
		}
	}
}

// plainState is StreamState without its own encoding.
type plainState StreamState

// packedState is a StreamState's JSON, gzip-compressed.
type packedState struct {
	Packed []byte `json:"packed"`
}

// packedPrefix starts the encoding of a packed state.
var packedPrefix = []byte(`{"packed":`)

// MarshalJSON encodes the state as JSON, packed (gzip, as {"packed":
// base64}) when that is over packAbove.
func (s StreamState) MarshalJSON() ([]byte, error) { return encodeState(s, gzip.DefaultCompression) }

// encodeState is MarshalJSON with the given gzip level.
func encodeState(s StreamState, level int) ([]byte, error) {
	b, err := json.Marshal(plainState(s))
	if err != nil || len(b) <= packAbove {
		return b, err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, level)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return json.Marshal(packedState{Packed: buf.Bytes()})
}

// UnmarshalJSON decodes a state, packed or not.
func (s *StreamState) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(b), packedPrefix) {
		var p packedState
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("packed stream state: %w", err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(p.Packed))
		if err != nil {
			return fmt.Errorf("packed stream state: %w", err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			return fmt.Errorf("packed stream state: %w", err)
		}
	}
	return json.Unmarshal(b, (*plainState)(s))
}
