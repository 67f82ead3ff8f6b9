package main

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// kstatusOf is status.Compute on the object, as kstatus-based tools read it.
func kstatusOf(obj map[string]any) Verdict {
	res, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		return Verdict{Status: "error", Message: err.Error()}
	}
	return Verdict{Status: res.Status.String(), Message: res.Message}
}
