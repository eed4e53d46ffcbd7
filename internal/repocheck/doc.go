// Package repocheck holds checks of the repository itself rather than of
// one package: the docs against the code (links, make targets, config
// fields, operator commands, metrics) and the compose file against its
// schema. It has no code of its own; `make test` runs its tests.
package repocheck
