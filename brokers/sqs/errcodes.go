package sqs

// The AWS error codes the adapter classifies, in one place: Publish
// (refusedCall), New (credentialRefusal) and the settlements
// (settleReason) read the same sets. Sources: the SQS API reference's
// "Common Errors" and each action's "Errors", plus the codes the SDK and
// IAM report for credentials.

// throttleCodes are the codes of a request SQS refused for its rate.
var throttleCodes = set("RequestThrottled", "AWS.SimpleQueueService.RequestThrottled", "ThrottlingException",
	"Throttling", "TooManyRequestsException", "KmsThrottled")

// refusalCodes are the codes of credentials or a signature the server
// refuses (the JSON protocol's UnrecognizedClientException included).
var refusalCodes = set("InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
	"IncompleteSignature", "MissingAuthenticationToken", "InvalidSecurity",
	"AccessDenied", "AccessDeniedException", "AuthFailure", "InvalidAccessKeyId")

// outageCodes are the error codes of a whole SendMessageBatch call that
// say nothing about the messages it carried, whatever their HTTP status
// (SQS answers throttling and some authentication errors with 400):
// throttling (throttleCodes), refused credentials (refusalCodes), the
// SendMessageBatch errors QueueDoesNotExist, InvalidAddress,
// UnsupportedOperation and the Kms* key errors, and the common errors
// NotAuthorized, OptInRequired, RequestExpired, ServiceUnavailable and
// InternalFailure.
var outageCodes = union(throttleCodes, refusalCodes, set(
	"KmsAccessDenied", "KmsDisabled", "KmsInvalidKeyUsage", "KmsInvalidState", "KmsNotFound", "KmsOptInRequired",
	"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "NonExistentQueue",
	"InvalidAddress", "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation",
	"NotAuthorized", "OptInRequired", "RequestExpired", "ExpiredToken", "ExpiredTokenException",
	"ServiceUnavailable", "InternalFailure", "InternalError", "RequestTimeout"))

func set(codes ...string) map[string]bool {
	m := make(map[string]bool, len(codes))
	for _, c := range codes {
		m[c] = true
	}
	return m
}

func union(sets ...map[string]bool) map[string]bool {
	m := map[string]bool{}
	for _, s := range sets {
		for c := range s {
			m[c] = true
		}
	}
	return m
}
