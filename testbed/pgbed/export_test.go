package pgbed

// SetPickPort replaces how nodes pick their ports until the returned
// function restores it.
func SetPickPort(f func() (int, error)) (restore func()) {
	old := pickPort
	pickPort = f
	return func() { pickPort = old }
}
