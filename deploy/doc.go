// Package deploy holds tests of the deployment files at the repository root.
package deploy
