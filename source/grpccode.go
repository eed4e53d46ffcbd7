package source

import (
	"strings"

	"google.golang.org/grpc/codes"
)

// GRPCCodeName returns a gRPC status code's canonical name ("UNAVAILABLE"),
// as gRPC's status codes document them (codes.Code's String is CamelCase):
// the reason an adapter of a gRPC source gives for an error classified by
// its code.
func GRPCCodeName(c codes.Code) string {
	if n, ok := grpcCodeNames[c]; ok {
		return n
	}
	return strings.ToUpper(c.String())
}

var grpcCodeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}
