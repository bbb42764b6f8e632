// The public header must compile as C++ (and link: extern "C").
#include "kvcache.h"

int main()
{
	kvc_hash h;
	kvc_hash_seed(&h);
	return kvc_strerror(KVC_ENOSPC) ? 0 : 1;
}
