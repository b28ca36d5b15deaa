package payment

// Status is where a payment is in its life. Unknown is never treated as failed: the bank may have
// moved the money, so only reconciliation (or an operator) may resolve it.
type Status string

const (
	StatusProcessing Status = "processing"
	StatusSucceeded  Status = "succeeded"
	StatusFailed     Status = "failed"
	StatusUnknown    Status = "unknown"
)

// Failure codes a failed payment carries.
const (
	FailureInsufficientFunds = "insufficient_funds"
	FailureDeclined          = "declined"
)

var transitions = map[Status][]Status{
	StatusProcessing: {StatusSucceeded, StatusFailed, StatusUnknown},
	StatusUnknown:    {StatusSucceeded, StatusFailed},
}

// CanBecome reports whether s may move to next.
func (s Status) CanBecome(next Status) bool {
	for _, t := range transitions[s] {
		if t == next {
			return true
		}
	}
	return false
}

// Final reports whether no further transition is possible.
func (s Status) Final() bool { return s == StatusSucceeded || s == StatusFailed }
