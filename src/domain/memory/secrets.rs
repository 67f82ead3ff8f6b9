//! The secret catalog: the shapes of credentials that memory never stores
//! (`spec/000` "Memory-write pipeline" step 4, "redact secrets").
//!
//! Each rule is one credential format as the public secret-scanner rule sets document it
//! (token prefixes, lengths, alphabets, key block headers, the names `.env` files and
//! signed URLs use), written here as our own patterns. A rule has a stable id (the
//! `[REDACTED:<id>]` marker), a description, the literal keywords that must occur for it
//! to be tried at all, and a pattern; a pattern with capture groups named `secret*`
//! redacts only those groups (the value of an assignment, the signature of a URL), the
//! others the whole match.
//!
//! Speed: one `RegexSet` over every rule's keywords is run first, and only the rules
//! whose keywords occur are matched. Word boundaries are ASCII (`(?-u:\b)`) so the lazy
//! DFA serves every pattern, whatever the text's script.
//!
//! The corpora that measure the catalog (one positive and one negative example per
//! rule at least) are `tests/data/secrets/{positive,negative}.jsonl`, checked by
//! `tests/memory_detectors.rs`.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

/// One credential format.
#[derive(Clone, Copy, Debug)]
pub struct SecretRule {
    /// Stable id, also the redaction marker: `[REDACTED:<id>]`.
    pub id: &'static str,
    pub description: &'static str,
    /// Lower-case literals, one of which occurs (case-insensitively) in every match;
    /// empty: always tried.
    pub keywords: &'static [&'static str],
    pattern: &'static str,
    /// Shortest redacted span, bytes (a pattern cannot say "12 characters, one a
    /// digit" on its own).
    min_len: usize,
}

impl SecretRule {
    const fn min_len(self, min_len: usize) -> SecretRule {
        SecretRule { min_len, ..self }
    }
}

const fn rule(
    id: &'static str,
    description: &'static str,
    keywords: &'static [&'static str],
    pattern: &'static str,
) -> SecretRule {
    SecretRule {
        id,
        description,
        keywords,
        pattern,
        min_len: 1,
    }
}

/// What an assignment's value may be: not empty, not a placeholder (`$VAR`, `${VAR}`,
/// `<value>`, `{{ var }}`), not already redacted.
macro_rules! value {
    ($min:literal) => {
        concat!(r#"["']?(?P<secret>[^\s"'$<{\[,;][^\s"',;]{"#, $min, ",})")
    };
}

/// An assignment `name = value` / `name: value` / `"name": "value"`.
macro_rules! assign {
    ($name:literal, $min:literal) => {
        concat!(r#"(?i)\b"#, $name, r#"["']?\s*[:=]\s*"#, value!($min))
    };
}

/// A PEM-style key block: its header, some content, then its footer or the end of the
/// text (a truncated key is still a key).
macro_rules! key_block {
    ($label:literal) => {
        concat!(
            r"(?s)-----BEGIN ",
            $label,
            r"-----(?:\s|\\[rn])*[A-Za-z0-9+/=:\-]",
            r".*?(?:-----END ",
            $label,
            r"-----|\z)"
        )
    };
}

/// The catalog, most specific first: where matches of several rules overlap, the
/// marker names the first.
#[rustfmt::skip]
pub static CATALOG: &[SecretRule] = &[
    // --- private key material
    rule("private_key_rsa", "PEM RSA private key (PKCS#1)", &["begin rsa private key"], key_block!("RSA PRIVATE KEY")),
    rule("private_key_ec", "PEM EC private key (SEC1)", &["begin ec private key"], key_block!("EC PRIVATE KEY")),
    rule("private_key_dsa", "PEM DSA private key", &["begin dsa private key"], key_block!("DSA PRIVATE KEY")),
    rule("private_key_openssh", "OpenSSH private key", &["begin openssh private key"], key_block!("OPENSSH PRIVATE KEY")),
    rule("private_key_pkcs8", "PEM PKCS#8 private key", &["begin private key"], key_block!("PRIVATE KEY")),
    rule("private_key_encrypted", "PEM encrypted PKCS#8 private key", &["begin encrypted private key"], key_block!("ENCRYPTED PRIVATE KEY")),
    rule("private_key_pgp", "OpenPGP private key block", &["begin pgp private key block"], key_block!("PGP PRIVATE KEY BLOCK")),
    rule("private_key_ssh2", "SSH2 (RFC 4716 style) encrypted private key", &["begin ssh2 encrypted private key"], r"(?s)---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----.*?(?:---- END SSH2 ENCRYPTED PRIVATE KEY ----|\z)"),
    rule("putty_private_key", "PuTTY private key file (.ppk) private lines", &["private-lines:"], r"(?s)Private-Lines:\s*\d+\s*(?P<secret>[A-Za-z0-9+/=\s]{16,}?)(?:Private-MAC|Private-Hash|\z)"),
    rule("openvpn_static_key", "OpenVPN static key", &["openvpn static key"], r"(?s)-----BEGIN OpenVPN Static key V1-----.*?(?:-----END OpenVPN Static key V1-----|\z)"),
    rule("age_secret_key", "age encryption secret key (bech32)", &["age-secret-key-1"], r"\bAGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}\b"),
    // --- cloud providers
    rule("aws_access_key_id", "AWS access key id (AKIA/ASIA/... + 16 base32)", &["akia", "asia", "abia", "acca", "agpa", "aida", "aipa", "anpa", "anva", "apka", "aroa", "asca"], r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z2-7]{16}\b"),
    rule("aws_secret_access_key", "AWS secret access key assignment (40 base64)", &["secret_access_key", "secretaccesskey"], r#"(?i)\b(?:aws_?)?secret_?access_?key["']?\s*[:=]\s*["']?(?P<secret>[A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+=]|\z)"#),
    rule("aws_session_token", "AWS session or security token assignment", &["session_token", "sessiontoken", "security_token"], r#"(?i)\b(?:aws_?)?(?:session|security)_?token["']?\s*[:=]\s*["']?(?P<secret>[A-Za-z0-9/+=]{100,})"#),
    rule("aws_mws_key", "Amazon MWS auth token", &["amzn.mws"], r"\bamzn\.mws\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
    rule("aws_presigned_signature", "S3 / SigV4 presigned URL signature (X-Amz-Signature)", &["x-amz-signature"], r"(?i)[?&]X-Amz-Signature=(?P<secret>[0-9a-f]{64})"),
    rule("aws_presigned_security_token", "presigned URL session token (X-Amz-Security-Token)", &["x-amz-security-token"], r"(?i)[?&]X-Amz-Security-Token=(?P<secret>[A-Za-z0-9%/+=_\-]{40,})"),
    rule("gcs_signed_url_signature", "Google Cloud Storage V4 signed URL signature (X-Goog-Signature)", &["x-goog-signature"], r"(?i)[?&]X-Goog-Signature=(?P<secret>[0-9a-f]{64,})"),
    rule("url_signature_param", "query-string signature of a signed URL (S3 V2, GCS V2, CloudFront)", &["signature="], r"[?&]Signature=(?P<secret>[A-Za-z0-9%~/+=_\-]{27,})"),
    rule("azure_sas_signature", "Azure shared access signature (sig= of a SAS URL or token)", &["sig="], r"(?i)(?:[?&;]|\b)sig=(?P<secret>[A-Za-z0-9%+/=]{30,})"),
    rule("azure_storage_account_key", "Azure storage connection string AccountKey", &["accountkey"], r"(?i)\bAccountKey=(?P<secret>[A-Za-z0-9+/]{20,}={0,2})"),
    rule("azure_shared_access_key", "Azure Service Bus / Event Hubs SharedAccessKey", &["sharedaccesskey"], r"(?i)\bSharedAccessKey=(?P<secret>[A-Za-z0-9+/]{20,}={0,2})"),
    rule("azure_ad_client_secret", "Microsoft Entra ID (Azure AD) client secret (xxx8Q~...)", &["q~"], r"(?:^|[^A-Za-z0-9_~.\-])(?P<secret>[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34})"),
    rule("azure_client_secret_assignment", "AZURE_CLIENT_SECRET assignment", &["azure_client_secret", "azureclientsecret"], assign!("azure_?client_?secret", 7)),
    rule("google_api_key", "Google API key (AIza + 35)", &["aiza"], r"\bAIza[A-Za-z0-9_\-]{35}"),
    rule("google_oauth_client_secret", "Google OAuth client secret (GOCSPX-)", &["gocspx-"], r"\bGOCSPX-[A-Za-z0-9_\-]{28}"),
    rule("google_oauth_access_token", "Google OAuth access token (ya29.)", &["ya29."], r"\bya29\.[A-Za-z0-9_\-]{30,}"),
    rule("google_oauth_refresh_token", "Google OAuth refresh token (1//0...)", &["1//0"], r"(?:^|[^A-Za-z0-9/])(?P<secret>1//0[A-Za-z0-9_\-]{40,})"),
    rule("gcp_private_key_id", "Google service-account key file private_key_id", &["private_key_id"], r#"(?i)"?private_key_id"?\s*[:=]\s*"?(?P<secret>[0-9a-f]{40})"#),
    rule("client_secret_assignment", "OAuth client secret assignment", &["client_secret", "clientsecret", "client-secret"], assign!(r"client[_\-]?secret", 7)),
    rule("digitalocean_pat", "DigitalOcean personal access token", &["dop_v1_"], r"\bdop_v1_[a-f0-9]{64}\b"),
    rule("digitalocean_oauth_token", "DigitalOcean OAuth token", &["doo_v1_"], r"\bdoo_v1_[a-f0-9]{64}\b"),
    rule("digitalocean_refresh_token", "DigitalOcean OAuth refresh token", &["dor_v1_"], r"\bdor_v1_[a-f0-9]{64}\b"),
    rule("alibaba_access_key_id", "Alibaba Cloud AccessKey id (LTAI)", &["ltai"], r"\bLTAI[A-Za-z0-9]{20}\b"),
    rule("tencent_secret_id", "Tencent Cloud SecretId (AKID)", &["akid"], r"\bAKID[A-Za-z0-9]{32}\b"),
    rule("yandex_api_key", "Yandex Cloud API key (AQVN)", &["aqvn"], r"\bAQVN[A-Za-z0-9_\-]{35,38}"),
    rule("yandex_iam_token", "Yandex Cloud IAM token (t1.)", &["t1."], r"\bt1\.[A-Za-z0-9_\-]+=*\.[A-Za-z0-9_\-]{86}"),
    rule("yandex_access_key", "Yandex Cloud static access key (YC)", &["yc"], r"\bYC[A-Za-z0-9_\-]{38}"),
    rule("scaleway_access_key", "Scaleway access key (SCW)", &["scw"], r"\bSCW[A-Z0-9]{17}\b"),
    rule("heroku_api_key", "Heroku API key (UUID named heroku)", &["heroku"], r#"(?i)\bheroku[a-z_ \-]{0,20}(?:key|token|secret)["']?\s*[:=]\s*["']?(?P<secret>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"#),
    rule("heroku_api_key_v2", "Heroku API key (HRKU-)", &["hrku-"], r"\bHRKU-[A-Za-z0-9_\-]{58,}"),
    rule("cloudflare_origin_ca_key", "Cloudflare Origin CA key (v1.0-)", &["v1.0-"], r"\bv1\.0-[a-f0-9]{24}-[a-f0-9]{146}\b"),
    rule("cloudflare_api_token", "Cloudflare API token or key assignment", &["cloudflare"], r#"(?i)\bcloudflare[a-z_ \-]{0,20}(?:key|token)["']?\s*[:=]\s*["']?(?P<secret>[A-Za-z0-9_\-]{37,40})"#),
    rule("databricks_token", "Databricks personal access token (dapi)", &["dapi"], r"\bdapi[a-f0-9]{32}(?:-\d)?\b"),
    // --- source control, registries, CI and infrastructure
    rule("github_pat", "GitHub personal access token, classic (ghp_)", &["ghp_"], r"\bghp_[A-Za-z0-9]{36}\b"),
    rule("github_oauth_token", "GitHub OAuth access token (gho_)", &["gho_"], r"\bgho_[A-Za-z0-9]{36}\b"),
    rule("github_user_to_server_token", "GitHub App user-to-server token (ghu_)", &["ghu_"], r"\bghu_[A-Za-z0-9]{36}\b"),
    rule("github_server_to_server_token", "GitHub App installation token (ghs_)", &["ghs_"], r"\bghs_[A-Za-z0-9]{36}\b"),
    rule("github_refresh_token", "GitHub refresh token (ghr_)", &["ghr_"], r"\bghr_[A-Za-z0-9]{36,76}\b"),
    rule("github_fine_grained_pat", "GitHub fine-grained personal access token (github_pat_)", &["github_pat_"], r"\bgithub_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}\b"),
    rule("gitlab_pat", "GitLab personal, project or group access token (glpat-)", &["glpat-"], r"\bglpat-[A-Za-z0-9_\-]{20,}"),
    rule("gitlab_pipeline_trigger_token", "GitLab pipeline trigger token (glptt-)", &["glptt-"], r"\bglptt-[a-f0-9]{40}\b"),
    rule("gitlab_runner_registration_token", "GitLab runner registration token (GR1348941)", &["gr1348941"], r"\bGR1348941[A-Za-z0-9_\-]{20}"),
    rule("gitlab_runner_auth_token", "GitLab runner authentication token (glrt-)", &["glrt-"], r"\bglrt-[A-Za-z0-9_\-]{20,}"),
    rule("gitlab_deploy_token", "GitLab deploy token (gldt-)", &["gldt-"], r"\bgldt-[A-Za-z0-9_\-]{20,}"),
    rule("gitlab_feed_token", "GitLab feed token (glft-)", &["glft-"], r"\bglft-[A-Za-z0-9_\-]{20,}"),
    rule("gitlab_scim_token", "GitLab SCIM token (glsoat-)", &["glsoat-"], r"\bglsoat-[A-Za-z0-9_\-]{20,}"),
    rule("gitlab_oauth_app_secret", "GitLab OAuth application secret (gloas-)", &["gloas-"], r"\bgloas-[A-Za-z0-9_\-]{64}"),
    rule("gitlab_incoming_mail_token", "GitLab incoming mail token (glimt-)", &["glimt-"], r"\bglimt-[A-Za-z0-9_\-]{25}"),
    rule("gitlab_ci_job_token", "GitLab CI/CD job token (glcbt-)", &["glcbt-"], r"\bglcbt-[A-Za-z0-9_\-]{20,}"),
    rule("bitbucket_app_password", "Bitbucket app password or API token (ATBB)", &["atbb"], r"\bATBB[A-Za-z0-9_=.\-]{28,}"),
    rule("atlassian_api_token", "Atlassian API token (ATATT3)", &["atatt3"], r"\bATATT3[A-Za-z0-9_\-=]{150,}"),
    rule("npm_token", "npm access token (npm_)", &["npm_"], r"\bnpm_[A-Za-z0-9]{36}\b"),
    rule("npmrc_auth_token", ".npmrc _authToken", &["_authtoken"], concat!(r"(?i)_authToken\s*=\s*", value!(7))),
    rule("pypi_token", "PyPI upload token (pypi-AgEIcHlwaS5vcmc)", &["pypi-ageichlwas5vcmc"], r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}"),
    rule("rubygems_api_key", "RubyGems API key (rubygems_)", &["rubygems_"], r"\brubygems_[a-f0-9]{48}\b"),
    rule("nuget_api_key", "NuGet API key (oy2)", &["oy2"], r"\boy2[a-z0-9]{43}\b"),
    rule("clojars_token", "Clojars deploy token (CLOJARS_)", &["clojars_"], r"\bCLOJARS_[a-z0-9]{60}\b"),
    rule("dockerhub_token", "Docker Hub personal or organization access token (dckr_pat_, dckr_oat_)", &["dckr_"], r"\bdckr_(?:pat|oat)_[A-Za-z0-9_\-]{27,}"),
    rule("docker_config_auth", "Docker config.json registry auth (base64 user:password)", &["\"auth\""], r#""auth"\s*:\s*"(?P<secret>[A-Za-z0-9+/]{16,}={0,2})""#),
    rule("artifactory_api_key", "JFrog Artifactory API key (AKCp)", &["akcp"], r"\bAKCp[A-Za-z0-9]{69}\b"),
    rule("artifactory_reference_token", "JFrog Artifactory reference token (cmVmdGtuOjAxOj)", &["cmvmdgtuojaxoj"], r"\bcmVmdGtuOjAxOj[A-Za-z0-9]{40,}"),
    rule("terraform_cloud_token", "Terraform Cloud / Enterprise API token (.atlasv1.)", &["atlasv1"], r"\b[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=\-]{60,70}"),
    rule("vault_service_token", "HashiCorp Vault service token (hvs.)", &["hvs."], r"\bhvs\.[A-Za-z0-9_\-]{90,}"),
    rule("vault_batch_token", "HashiCorp Vault batch token (hvb.)", &["hvb."], r"\bhvb\.[A-Za-z0-9_\-]{130,}"),
    rule("circleci_pat", "CircleCI personal API token (CCIPAT_)", &["ccipat_"], r"\bCCIPAT_[A-Za-z0-9]{22}_[a-f0-9]{40}\b"),
    rule("pulumi_access_token", "Pulumi access token (pul-)", &["pul-"], r"\bpul-[a-f0-9]{40}\b"),
    rule("doppler_token", "Doppler token (dp.pt., dp.st., dp.ct., dp.sa., dp.scim., dp.audit.)", &["dp."], r"\bdp\.(?:pt|st|ct|sa|scim|audit)\.[A-Za-z0-9]{40,44}\b"),
    rule("sourcegraph_token", "Sourcegraph access token (sgp_)", &["sgp_"], r"\bsgp_(?:[a-f0-9]{16}_)?[a-f0-9]{40}\b"),
    rule("grafana_cloud_token", "Grafana Cloud API token (glc_)", &["glc_"], r"\bglc_[A-Za-z0-9+/]{32,}={0,2}"),
    rule("grafana_service_account_token", "Grafana service account token (glsa_)", &["glsa_"], r"\bglsa_[A-Za-z0-9]{32}_[a-f0-9]{8}\b"),
    rule("sentry_org_token", "Sentry organization auth token (sntrys_)", &["sntrys_"], r"\bsntrys_eyJ[A-Za-z0-9+/=_\-]{30,}"),
    rule("sentry_user_token", "Sentry user auth token (sntryu_)", &["sntryu_"], r"\bsntryu_[a-f0-9]{64}\b"),
    rule("buildkite_token", "Buildkite user access token (bkua_)", &["bkua_"], r"\bbkua_[a-f0-9]{40}\b"),
    rule("octopus_deploy_api_key", "Octopus Deploy API key (API-)", &["api-"], r"\bAPI-[A-Z0-9]{26}\b"),
    rule("infracost_api_key", "Infracost API key (ico-)", &["ico-"], r"\bico-[A-Za-z0-9]{32}\b"),
    rule("scalingo_api_token", "Scalingo API token (tk-us-)", &["tk-us-"], r"\btk-us-[A-Za-z0-9_\-]{48}"),
    rule("prefect_api_key", "Prefect API key (pnu_)", &["pnu_"], r"\bpnu_[A-Za-z0-9]{36}\b"),
    rule("planetscale_token", "PlanetScale service token, password or OAuth token (pscale_)", &["pscale_"], r"\bpscale_(?:tkn|pw|oauth)_[A-Za-z0-9=._\-]{32,64}"),
    rule("supabase_management_token", "Supabase management API token (sbp_)", &["sbp_"], r"\bsbp_[a-f0-9]{40}\b"),
    rule("onepassword_service_account_token", "1Password service account token (ops_eyJ)", &["ops_eyj"], r"\bops_eyJ[A-Za-z0-9+/=_\-]{250,}"),
    rule("onepassword_secret_key", "1Password account secret key (A3-)", &["a3-"], r"\bA3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}\b"),
    rule("kubeconfig_client_key_data", "kubeconfig client-key-data (a base64 private key)", &["client-key-data"], r"(?i)\bclient-key-data\s*:\s*(?P<secret>[A-Za-z0-9+/]{20,}={0,2})"),
    // --- observability and SaaS
    rule("new_relic_user_api_key", "New Relic user API key (NRAK-)", &["nrak-"], r"\bNRAK-[A-Z0-9]{27}\b"),
    rule("new_relic_insert_key", "New Relic insert key (NRII-)", &["nrii-"], r"\bNRII-[A-Za-z0-9_\-]{32}"),
    rule("new_relic_browser_key", "New Relic browser API token (NRJS-)", &["nrjs-"], r"\bNRJS-[a-f0-9]{19}\b"),
    rule("dynatrace_token", "Dynatrace API token (dt0c01.)", &["dt0c01."], r"\bdt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}\b"),
    rule("datadog_api_key", "Datadog API key assignment (32 hex)", &["dd_api_key", "datadog_api_key", "ddapikey", "datadogapikey", "dd-api-key"], r#"(?i)\b(?:dd|datadog)[_\-]?api[_\-]?key["']?\s*[:=]\s*["']?(?P<secret>[a-f0-9]{32})\b"#),
    rule("datadog_app_key", "Datadog application key assignment (40 hex)", &["dd_app", "datadog_app", "ddapp", "datadogapp", "dd-app", "dd_application", "datadog_application"], r#"(?i)\b(?:dd|datadog)[_\-]?app(?:lication)?[_\-]?key["']?\s*[:=]\s*["']?(?P<secret>[a-f0-9]{40})\b"#),
    rule("linear_api_key", "Linear API key (lin_api_)", &["lin_api_"], r"\blin_api_[A-Za-z0-9]{40}\b"),
    rule("postman_api_key", "Postman API key (PMAK-)", &["pmak-"], r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}\b"),
    rule("readme_api_key", "ReadMe API key (rdme_)", &["rdme_"], r"\brdme_[a-z0-9]{70}\b"),
    rule("figma_pat", "Figma personal access token (figd_)", &["figd_"], r"\bfigd_[A-Za-z0-9_\-]{40,}"),
    rule("notion_token", "Notion integration token (ntn_)", &["ntn_"], r"\bntn_[A-Za-z0-9]{40,}\b"),
    rule("notion_integration_secret", "Notion internal integration secret (secret_ + 43)", &["secret_"], r"\bsecret_[A-Za-z0-9]{43}\b"),
    rule("airtable_pat", "Airtable personal access token (pat....)", &["pat"], r"\bpat[A-Za-z0-9]{14}\.[a-f0-9]{64}\b"),
    rule("contentful_pat", "Contentful personal access token (CFPAT-)", &["cfpat-"], r"\bCFPAT-[A-Za-z0-9_\-]{43}"),
    rule("frameio_token", "Frame.io developer token (fio-u-)", &["fio-u-"], r"\bfio-u-[A-Za-z0-9_=\-]{64}"),
    rule("adafruit_io_key", "Adafruit IO key (aio_)", &["aio_"], r"\baio_[A-Za-z0-9]{28}\b"),
    rule("mapbox_secret_token", "Mapbox secret access token (sk.eyJ)", &["sk.eyj"], r"\bsk\.eyJ[A-Za-z0-9_\-]{50,}\.[A-Za-z0-9_\-]{20,}"),
    rule("firebase_fcm_server_key", "Firebase Cloud Messaging server key (AAAA...:APA91b)", &[":apa91b"], r"\bAAAA[A-Za-z0-9_\-]{7}:APA91b[A-Za-z0-9_\-]{134}"),
    rule("okta_api_token", "Okta API token in an SSWS authorization", &["ssws"], r"(?i)\bSSWS\s+(?P<secret>00[A-Za-z0-9_\-]{40})"),
    rule("facebook_access_token", "Facebook / Meta Graph access token (EAA)", &["eaa"], r"\bEAA[A-Za-z0-9]{90,}"),
    // --- messaging and mail
    rule("slack_bot_token", "Slack bot token (xoxb-)", &["xoxb-"], r"\bxoxb-[0-9]{8,13}-[A-Za-z0-9\-]{8,}"),
    rule("slack_user_token", "Slack user token (xoxp-)", &["xoxp-"], r"\bxoxp-[0-9]{8,13}-[A-Za-z0-9\-]{20,}"),
    rule("slack_app_token", "Slack app-level token (xapp-)", &["xapp-"], r"\bxapp-\d-[A-Za-z0-9\-]{20,}"),
    rule("slack_legacy_token", "Slack workspace, legacy or refresh token (xoxa-, xoxr-, xoxo-, xoxs-)", &["xoxa-", "xoxr-", "xoxo-", "xoxs-"], r"\bxox[aros]-[0-9]{1,13}-[A-Za-z0-9\-]{8,}"),
    rule("slack_config_token", "Slack configuration access or refresh token (xoxe.)", &["xoxe"], r"\bxoxe(?:\.xox[bp])?-\d-[A-Za-z0-9]{100,}"),
    rule("slack_webhook_url", "Slack incoming webhook or workflow URL", &["hooks.slack.com"], r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9+/_\-]{30,})"),
    rule("discord_bot_token", "Discord bot token (three base64url parts)", &[], r"\b[MNO][A-Za-z0-9_\-]{23,25}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}"),
    rule("discord_webhook_url", "Discord webhook URL token", &["discord"], r"discord(?:app)?\.com/api/webhooks/\d+/(?P<secret>[A-Za-z0-9_\-]{60,68})"),
    rule("telegram_bot_token", "Telegram bot token (id:AA...)", &[":aa"], r"\b\d{8,10}:AA[A-Za-z0-9_\-]{33}"),
    rule("teams_webhook_url", "Microsoft Teams incoming webhook URL", &["webhook.office.com"], r"webhook\.office\.com/webhookb2/(?P<secret>[A-Za-z0-9@/\-]{60,})"),
    rule("twilio_api_key", "Twilio API key SID (SK + 32 hex)", &["sk"], r"\bSK[0-9a-fA-F]{32}\b"),
    rule("sendgrid_api_key", "SendGrid API key (SG.)", &["sg."], r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"),
    rule("mailgun_api_key", "Mailgun API key (key- + 32 hex)", &["key-"], r"\bkey-[a-f0-9]{32}\b"),
    rule("mailchimp_api_key", "Mailchimp API key (32 hex + -usN)", &["-us"], r"\b[a-f0-9]{32}-us\d{1,2}\b"),
    rule("brevo_api_key", "Brevo (Sendinblue) API key (xkeysib-)", &["xkeysib-"], r"\bxkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}\b"),
    // --- payments and commerce
    rule("stripe_secret_key", "Stripe secret key (sk_live_, sk_test_)", &["sk_live_", "sk_test_"], r"\bsk_(?:live|test)_[A-Za-z0-9]{16,}"),
    rule("stripe_restricted_key", "Stripe restricted key (rk_live_, rk_test_)", &["rk_live_", "rk_test_"], r"\brk_(?:live|test)_[A-Za-z0-9]{16,}"),
    rule("stripe_publishable_key", "Stripe publishable key (pk_live_, pk_test_): public, but names the account", &["pk_live_", "pk_test_"], r"\bpk_(?:live|test)_[A-Za-z0-9]{16,}"),
    rule("stripe_webhook_secret", "Stripe webhook signing secret (whsec_)", &["whsec_"], r"\bwhsec_[A-Za-z0-9]{32,}"),
    rule("square_access_token", "Square access token (sq0atp-, EAAA)", &["sq0atp-", "eaaa"], r"\b(?:sq0atp-[A-Za-z0-9_\-]{22}|EAAA[A-Za-z0-9_\-+=]{60})"),
    rule("square_oauth_secret", "Square OAuth application secret (sq0csp-)", &["sq0csp-"], r"\bsq0csp-[A-Za-z0-9_\-]{43}"),
    rule("braintree_access_token", "Braintree / PayPal access token (access_token$production$...)", &["access_token$"], r"\baccess_token\$(?:production|sandbox)\$[a-z0-9]{16}\$[a-f0-9]{32}\b"),
    rule("shopify_access_token", "Shopify Admin API access token (shpat_)", &["shpat_"], r"\bshpat_[a-fA-F0-9]{32}\b"),
    rule("shopify_custom_app_token", "Shopify custom app access token (shpca_)", &["shpca_"], r"\bshpca_[a-fA-F0-9]{32}\b"),
    rule("shopify_private_app_token", "Shopify private app access token (shppa_)", &["shppa_"], r"\bshppa_[a-fA-F0-9]{32}\b"),
    rule("shopify_shared_secret", "Shopify app shared secret (shpss_)", &["shpss_"], r"\bshpss_[a-fA-F0-9]{32}\b"),
    rule("flutterwave_secret_key", "Flutterwave secret key (FLWSECK-)", &["flwseck"], r"\bFLWSECK(?:_TEST)?-[a-f0-9]{32}-X\b"),
    rule("plaid_access_token", "Plaid access token (access-<env>-uuid)", &["access-sandbox-", "access-development-", "access-production-"], r"\baccess-(?:sandbox|development|production)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
    rule("shippo_api_token", "Shippo API token (shippo_live_, shippo_test_)", &["shippo_"], r"\bshippo_(?:live|test)_[a-f0-9]{40}\b"),
    rule("easypost_api_key", "EasyPost API key (EZAK, EZTK)", &["ezak", "eztk"], r"\bEZ[AT]K[A-Za-z0-9]{54}\b"),
    rule("duffel_api_token", "Duffel API token (duffel_live_, duffel_test_)", &["duffel_"], r"\bduffel_(?:live|test)_[A-Za-z0-9_=\-]{43}"),
    // --- model providers
    rule("anthropic_api_key", "Anthropic API key (sk-ant-apiNN-)", &["sk-ant-api"], r"\bsk-ant-api\d{2}-[A-Za-z0-9_\-]{20,}"),
    rule("anthropic_admin_key", "Anthropic admin key (sk-ant-adminNN-)", &["sk-ant-admin"], r"\bsk-ant-admin\d{2}-[A-Za-z0-9_\-]{20,}"),
    rule("openai_project_key", "OpenAI project key (sk-proj-)", &["sk-proj-"], r"\bsk-proj-[A-Za-z0-9_\-]{20,}"),
    rule("openai_service_account_key", "OpenAI service account key (sk-svcacct-)", &["sk-svcacct-"], r"\bsk-svcacct-[A-Za-z0-9_\-]{20,}"),
    rule("openai_admin_key", "OpenAI admin key (sk-admin-)", &["sk-admin-"], r"\bsk-admin-[A-Za-z0-9_\-]{20,}"),
    rule("openai_legacy_key", "OpenAI user key (sk- with the T3BlbkFJ marker)", &["t3blbkfj"], r"\bsk-[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}\b"),
    rule("openai_compatible_key", "sk- key of an OpenAI-compatible provider (32+ characters)", &["sk-"], r"\bsk-[A-Za-z0-9_\-]{32,}"),
    rule("huggingface_token", "Hugging Face user access token (hf_)", &["hf_"], r"\bhf_[A-Za-z0-9]{30,}\b"),
    rule("huggingface_org_token", "Hugging Face organization API token (api_org_)", &["api_org_"], r"\bapi_org_[A-Za-z0-9]{34}\b"),
    rule("groq_api_key", "Groq API key (gsk_)", &["gsk_"], r"\bgsk_[A-Za-z0-9]{52}\b"),
    rule("replicate_api_token", "Replicate API token (r8_)", &["r8_"], r"\br8_[A-Za-z0-9]{37}\b"),
    rule("perplexity_api_key", "Perplexity API key (pplx-)", &["pplx-"], r"\bpplx-[A-Za-z0-9]{48}\b"),
    rule("xai_api_key", "xAI API key (xai-)", &["xai-"], r"\bxai-[A-Za-z0-9]{80}\b"),
    rule("langsmith_api_key", "LangSmith API key (lsv2_pt_, lsv2_sk_)", &["lsv2_"], r"\blsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}\b"),
    rule("wandb_api_key", "Weights & Biases API key assignment (40 hex)", &["wandb_api_key"], r#"(?i)\bwandb_api_key["']?\s*[:=]\s*["']?(?P<secret>[a-f0-9]{40})\b"#),
    // --- credential hashes
    rule("bcrypt_hash", "bcrypt password hash ($2a$, $2b$, $2y$)", &["$2"], r"\$2[aby]\$\d{2}\$[./A-Za-z0-9]{53}"),
    rule("sha512_crypt_hash", "SHA-512 crypt password hash ($6$)", &["$6$"], r"\$6\$[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{86}"),
    // --- generic shapes and contextual forms (broadest last)
    rule("jwt", "JSON Web Token (three base64url parts, header and payload JSON)", &["eyj"], r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    rule("url_password", "password in a URL's user information (scheme://user:password@host)", &["://"], r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:(?P<secret>[^\s@/]+)@"),
    rule("authorization_header", "credentials of an Authorization or Proxy-Authorization header", &["authorization"], r#"(?i)\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token|digest|negotiate|ssws)\s+(?P<secret>[A-Za-z0-9\-._~+/_]{8,}=*)|(?P<secret2>[A-Za-z\-._~+/_]{0,200}[0-9][A-Za-z0-9\-._~+/_]{0,200}=*))"#).min_len(12),
    rule("bearer_token", "bearer token (with a digit, at least 12 characters)", &["bearer"], r"(?i)\bbearer\s+(?P<secret>[A-Za-z\-._~+/_]{0,200}[0-9][A-Za-z0-9\-._~+/_]{0,200}=*)").min_len(12),
    rule("api_key_header", "API key header (X-API-Key, api-key, X-Auth-Token)", &["api-key", "auth-token", "x-api-key"], r#"(?i)\b(?:x-)?(?:api-key|auth-token)["']?\s*:\s*["']?(?P<secret>[A-Za-z0-9\-._~+/=]{12,})"#),
    rule("netrc_password", ".netrc machine entry password", &["machine"], r"(?i)\bmachine\s+[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+\s+login\s+\S+\s+password\s+(?P<secret>\S+)"),
    rule("mysql_cli_password", "password given to the mysql client with -p", &["mysql"], r"\bmysql(?:dump|admin)?\b[^\n]*?\s-p(?P<secret>[^\s-][^\s]{3,})"),
    rule("sshpass_password", "password given to sshpass -p", &["sshpass"], r#"\bsshpass\s+-p\s*["']?(?P<secret>[^\s"']{4,})"#),
    rule("curl_user_password", "password given to curl -u / --user", &["curl"], r#"\bcurl\b[^\n]*?\s(?:-u|--user)\s*["']?[^\s:"']+:(?P<secret>[^\s"']{3,})"#),
    rule("redis_requirepass", "Redis requirepass / masterauth (a value with a digit, capital or symbol)", &["requirepass", "masterauth"], r#"(?i)\b(?:requirepass|masterauth)\s+["']?(?P<secret>[^\s"']*(?-i:[0-9A-Z!@#$%^&*+=?~])[^\s"']*)"#).min_len(8),
    rule("env_assignment", "a .env / shell / YAML assignment to a name ending in a secret word (DB_PASSWORD=..., export STRIPE_SECRET_KEY=...)", &["pass", "secret", "token", "key", "pwd", "credential"], r#"(?i)\b[A-Za-z0-9]+(?:[_\-][A-Za-z0-9]+)*?[_\-](?:password|passwd|pwd|pass|passphrase|secret|token|api_?key|apikey|access_?key|private_?key|secret_?key|auth_?key|signing_?key|encryption_?key|credentials?)["']?\s*[:=]\s*(?:"(?P<secret>[^"$<{\[\n][^"\n]{5,})"|'(?P<secret2>[^'$<{\[\n][^'\n]{5,})'|(?P<secret3>[^\s"'$<{\[,;#][^\s"',;]{5,}))"#),
    rule("password_assignment", "password assignment (password=..., \"passwd\": \"...\")", &["pass", "pwd"], concat!(r#"(?i)\b(?:password|passwd|pwd|passphrase)["']?\s*[:=]\s*"#, value!(5))),
    rule("password_phrase", "\"password is X\" where X has a digit or symbol", &["password", "passphrase", "passcode"], r#"(?i)\b(?:password|passphrase|passcode)\s+(?:is|was)\s*:?\s*["']?(?P<secret>[^\s"']*[0-9!@#$%^&*+=?~][^\s"']*)"#),
    rule("secret_assignment", "assignment to secret, api_key, access_token, auth_token, refresh_token, private_key (a value of 8 or more with a digit)", &["secret", "key", "token"], r#"(?i)\b(?:secret|api[_\- ]?key|apikey|access[_\- ]?token|auth[_\- ]?token|refresh[_\- ]?token|private[_\- ]?key|secret[_\- ]?key)["']?\s*[:=]\s*["']?(?P<secret>[^\s"'$<{\[,;][^\s"',;0-9]*[0-9][^\s"',;]*)"#).min_len(8),
];

struct Compiled {
    patterns: Vec<Regex>,
    /// Capture-group indices named `secret*` per rule; empty: redact the whole match.
    secret_groups: Vec<Vec<usize>>,
    /// One entry per rule with keywords; `keyword_rule[i]` is the rule of entry i.
    prefilter: RegexSet,
    keyword_rule: Vec<usize>,
    always: Vec<usize>,
}

fn compile(pattern: &str) -> Regex {
    // ASCII word boundaries keep the lazy DFA usable on non-ASCII text.
    let ascii = pattern.replace(r"\b", r"(?-u:\b)");
    Regex::new(&ascii).unwrap_or_else(|e| unreachable!("built-in secret pattern {pattern:?}: {e}"))
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| {
    let patterns: Vec<Regex> = CATALOG.iter().map(|r| compile(r.pattern)).collect();
    let secret_groups = patterns
        .iter()
        .map(|p| {
            p.capture_names()
                .enumerate()
                .filter_map(|(i, n)| n.filter(|n| n.starts_with("secret")).map(|_| i))
                .collect()
        })
        .collect();
    let mut keyword_patterns = Vec::new();
    let mut keyword_rule = Vec::new();
    let mut always = Vec::new();
    for (i, r) in CATALOG.iter().enumerate() {
        if r.keywords.is_empty() {
            always.push(i);
        } else {
            let alternatives: Vec<String> = r.keywords.iter().map(|k| regex::escape(k)).collect();
            keyword_patterns.push(format!("(?i:{})", alternatives.join("|")));
            keyword_rule.push(i);
        }
    }
    let prefilter = RegexSet::new(&keyword_patterns)
        .unwrap_or_else(|e| unreachable!("built-in secret keywords: {e}"));
    Compiled {
        patterns,
        secret_groups,
        prefilter,
        keyword_rule,
        always,
    }
});

/// One match of one rule: the byte range to redact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Index into [`CATALOG`].
    pub rule: usize,
    pub start: usize,
    pub end: usize,
}

impl Finding {
    pub fn rule_id(&self) -> &'static str {
        CATALOG.get(self.rule).map_or("secret", |r| r.id)
    }
}

static MARKER: LazyLock<Regex> = LazyLock::new(|| compile(r"\[REDACTED:[A-Za-z0-9_]+\]"));

/// Byte spans of the redaction markers (`[REDACTED:<id>]`) in `text`, in order.
pub fn marker_spans(text: &str) -> Vec<(usize, usize)> {
    if !text.contains("[REDACTED:") {
        return Vec::new();
    }
    MARKER
        .find_iter(text)
        .map(|m| (m.start(), m.end()))
        .collect()
}

/// The parts of `start..end` outside every marker span (`markers` sorted, disjoint).
fn outside_markers(start: usize, end: usize, markers: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut pieces = Vec::new();
    let mut at = start;
    for &(m_start, m_end) in markers {
        if m_end <= at {
            continue;
        }
        if m_start >= end {
            break;
        }
        if m_start > at {
            pieces.push((at, m_start));
        }
        at = at.max(m_end);
    }
    if at < end {
        pieces.push((at, end));
    }
    pieces
}

/// Every match of every rule in `text`, in catalog order. Markers already written
/// (`[REDACTED:...]`) are opaque: a match that runs over a marker is a finding only for
/// its parts outside markers, so a marker is never redacted again and never hides the
/// text beside it.
pub fn find_secrets(text: &str) -> Vec<Finding> {
    let markers = marker_spans(text);
    let c = &*COMPILED;
    let mut candidates: Vec<usize> = c
        .prefilter
        .matches(text)
        .into_iter()
        .filter_map(|i| c.keyword_rule.get(i).copied())
        .chain(c.always.iter().copied())
        .collect();
    candidates.sort_unstable();
    let mut out = Vec::new();
    for rule in candidates {
        let (Some(pattern), Some(groups)) = (c.patterns.get(rule), c.secret_groups.get(rule))
        else {
            continue;
        };
        let min_len = CATALOG.get(rule).map_or(1, |r| r.min_len.max(1));
        let mut push = |start: usize, end: usize| {
            if end - start < min_len {
                return;
            }
            for (start, end) in outside_markers(start, end, &markers) {
                out.push(Finding { rule, start, end });
            }
        };
        if groups.is_empty() {
            for m in pattern.find_iter(text) {
                push(m.start(), m.end());
            }
        } else {
            for caps in pattern.captures_iter(text) {
                for m in groups.iter().filter_map(|g| caps.get(*g)) {
                    push(m.start(), m.end());
                }
            }
        }
    }
    out
}

/// Replaces every secret with `[REDACTED:<rule id>]`; overlapping findings become one
/// marker naming the most specific rule (the first in the catalog). Returns the text,
/// the number of markers written, and the findings.
pub fn redact_with_findings(text: &str) -> (String, u32, Vec<Finding>) {
    let findings = find_secrets(text);
    if findings.is_empty() {
        return (text.to_owned(), 0, findings);
    }
    let mut spans = findings.clone();
    spans.sort_by_key(|f| (f.start, f.rule));
    // Merge overlapping spans, keeping the lowest rule index of each merged run.
    let mut merged: Vec<Finding> = Vec::new();
    for f in spans {
        match merged.last_mut() {
            Some(last) if f.start < last.end => {
                last.end = last.end.max(f.end);
                last.rule = last.rule.min(f.rule);
            }
            _ => merged.push(f),
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for m in &merged {
        out.push_str(text.get(at..m.start).unwrap_or_default());
        out.push_str("[REDACTED:");
        out.push_str(m.rule_id());
        out.push(']');
        at = m.end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    (
        out,
        u32::try_from(merged.len()).unwrap_or(u32::MAX),
        findings,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_compiles_with_unique_ids_and_lower_case_keywords() {
        assert!(CATALOG.len() >= 100, "{} rules", CATALOG.len());
        let mut ids: Vec<&str> = CATALOG.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), CATALOG.len(), "duplicate rule ids");
        for r in CATALOG {
            for k in r.keywords {
                assert_eq!(*k, k.to_lowercase(), "{}: keyword {k:?}", r.id);
            }
        }
        assert_eq!(COMPILED.patterns.len(), CATALOG.len());
    }

    #[test]
    fn overlapping_findings_become_one_marker_of_the_most_specific_rule() {
        let (out, n, findings) =
            redact_with_findings("export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012345");
        assert_eq!(out, "export OPENAI_API_KEY=[REDACTED:openai_project_key]");
        assert_eq!(n, 1);
        assert!(findings.len() >= 2, "{findings:?}");
        let (again, n, _) = redact_with_findings(&out);
        assert_eq!((again.as_str(), n), (out.as_str(), 0));
    }
}
